"""Device contracts: the allow-list, validation, canonical hashing and signatures.

Pure code: no Kubernetes, MQTT or MCP imports, so it is unit-tested without I/O
and shared by the controller, the gateway and the firmware catalog checks.
"""
