"""Guards both controllers consult before acting: interlocks, device leases and the agents' pause."""
