"""Guards both controllers consult before acting: interlocks, device leases and the agents' pause, each read as
models where its objects enter (kube.watched, api/lease.py)."""
