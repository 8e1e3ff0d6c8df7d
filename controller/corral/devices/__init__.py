"""The controller's side of the device protocol: the MQTT link, wire messages, command/ack correlation, telemetry.

Nothing here knows about Kubernetes; `reconcile/` connects the two.
"""
