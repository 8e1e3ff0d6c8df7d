"""Pure decision logic for Intents and Approvals: no Kubernetes, MQTT or MCP, no clock of its own.

`decide()` takes the facts and returns one outcome; `approvals` says which
approvals count; `idempotency` compares a re-sent request with the first.
"""
