"""The controller: one controller per kind, on the shared Kubernetes floor (`corral.kube`).

- `devices/`: what devices say over MQTT, and reconciling each Device toward its target;
- `intents/`: deciding and executing Intents (the judgement itself is `corral.decide`, pure);
- `guards/`: interlocks, device leases and the agents' pause, consulted by both;
- `mqttside.py`: the broker link and what hears devices through it;
- `doors.py`, `shardwork.py`, `shardlabels.py`: several replicas, each acting only for the devices it owns;
- `controller.py` wires them together (which events queue which keys) and `handlers.py` is the only contact
  with kopf.
"""
