"""The shard of a device: a stable hash of its device id, the same in every replica, process and release. Pure."""

from __future__ import annotations

import hashlib


def shard_of(device_id: str, shards: int) -> int:
    """SHA-256, not Python's hash() (salted per process) nor a CRC (clumps on ids that differ in a digit)."""
    if shards == 1:
        return 0
    digest = hashlib.sha256(device_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards
