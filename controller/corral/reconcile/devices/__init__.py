"""The Device controller: what devices say over MQTT (ingest), what the controller knows of them (runtime),
and reconciling each toward its Device's target (reconciler, driver, status, targets, trust, capabilities,
accounts, notices).
"""
