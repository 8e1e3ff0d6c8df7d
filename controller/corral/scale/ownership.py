"""Which devices this replica acts for, and until when: the one question every door asks before an effect.

`Ownership` is what the controller reads (reconcilers, the MQTT side, the status writers, the command sender);
`Standalone` is a controller alone, which owns every device for ever; `ShardOwnership` (shards.py) holds Leases.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from corral.scale.hashing import shard_of

# Called with a shard's number: acquired (start its work: queue its devices, resume its Intents), releasing
# (awaited before a voluntary release: stop its work and let in-flight Intents end), lost (the renew deadline
# passed: stop at once; nothing may be awaited that needs the API server).
ShardCallback = Callable[[int], Awaitable[None]]


class Ownership(Protocol):
    shards: int

    def owns(self, device_id: str) -> bool:
        """This replica holds the device's shard and is within its renew deadline: it may command the device and
        write its Device's and its Intents' status. Checked at every door, right before the effect."""
        ...

    def epoch(self, device_id: str) -> int | None:
        """The fencing token of the device's shard as this replica holds it (the Lease's acquireTime in ms; a
        later holder's is larger), carried in every command; None when it does not hold it, or stands alone."""
        ...

    def is_leader(self) -> bool:
        """Holds shard 0: does what only one replica may (the broker's accounts, deleting unused Capabilities)."""
        ...

    def owned(self) -> frozenset[int]:
        ...

    def set_callbacks(self, acquired: ShardCallback, releasing: ShardCallback, lost: ShardCallback) -> None:
        ...

    async def start(self) -> None:
        """Begin; returns once the first round of acquisition is done (a standby returns holding nothing)."""
        ...

    async def stop(self) -> None:
        """Release every held shard (after `releasing` for each), so a successor starts at once, not a lease
        duration later."""
        ...


class Standalone:
    """A controller alone: every device is its own, for ever; no Lease, no epoch."""

    shards = 1

    def owns(self, device_id: str) -> bool:
        return True

    def epoch(self, device_id: str) -> int | None:
        return None

    def is_leader(self) -> bool:
        return True

    def owned(self) -> frozenset[int]:
        return frozenset({0})

    def set_callbacks(self, acquired: ShardCallback, releasing: ShardCallback, lost: ShardCallback) -> None:
        self._acquired = acquired

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


__all__ = ["Ownership", "ShardCallback", "Standalone", "shard_of"]
