"""The doors a stale or foreign replica could act through, and the one question each asks before the effect.

Every command publish, Device status write, Intent status write and target apply asks `Doors` right before it
happens (docs/scale.md, "Fence 1"): does this replica own the device now (its shard's Lease, within the renew
deadline)? A door that says no raises `NotOwned`; the callers treat it as "not ours, drop it", never as a failure
to retry. Kept in one place so the rule reads once, instead of an `if` at each door.

An Intent belongs to the shard of its Device's deviceId, looked up in the DeviceCache every replica fills from its
watch; an Intent whose Device does not exist (or has no deviceId yet) belongs to the leader, so exactly one replica
answers it.
"""

from __future__ import annotations

import logging

from corral.api.base import ObjectMeta
from corral.reconcile.devices.cache import DeviceCache, device_id_of
from corral.reconcile.shardlabels import ShardLabels
from corral.scale.hashing import shard_of
from corral.scale.ownership import Ownership, Standalone

log = logging.getLogger(__name__)


class NotOwned(Exception):
    """This replica does not own the device (any more): the effect was not made. Not an error to retry."""


class Doors:
    def __init__(self, ownership: Ownership | None = None, devices: DeviceCache | None = None,
                 labels: ShardLabels | None = None) -> None:
        self.ownership: Ownership = ownership if ownership is not None else Standalone()
        self.devices = devices
        self.labels = labels  # the API server's fence selects objects by their shard label (shards > 1)
        # Shards whose new work waits (the gates refuse it) while their doors stay open: one being handed over (its
        # work in flight may still finish), or one just acquired whose devices are not heard again yet.
        self.waiting: set[int] = set()

    @property
    def sharded(self) -> bool:
        """Another replica may own some devices: the gates must be asked (a controller alone skips the lookups)."""
        return not isinstance(self.ownership, Standalone)

    def owns(self, device_id: str) -> bool:
        return self.ownership.owns(device_id)

    def epoch(self, device_id: str) -> int | None:
        return self.ownership.epoch(device_id)

    def is_leader(self) -> bool:
        return self.ownership.is_leader()

    def shard(self, device_id: str) -> int:
        return shard_of(device_id, self.ownership.shards)

    def takes(self, device_id: str | None) -> bool:
        """The gates' question: new work for this device is this replica's (owned, and not being handed over).
        No device id (a Device not bound, an Intent whose Device is unknown) is the leader's."""
        if not self.sharded:
            return True
        if not device_id:
            return self.is_leader() and 0 not in self.waiting
        return self.owns(device_id) and self.shard(device_id) not in self.waiting

    def takes_intent(self, namespace: str, device: str) -> bool:
        return self.takes(self.device_id(namespace, device)) if self.sharded else True

    def device_id(self, namespace: str, device: str) -> str | None:
        """The deviceId of the Device namespace/device as cached; None when it does not exist or has none."""
        found = self.devices.device((namespace, device)) if self.devices is not None else None
        return device_id_of(found) or None

    def owns_intent(self, namespace: str, device: str) -> bool:
        """The Intent on Device namespace/device is this replica's: its device's owner, or the leader's when the
        Device is unknown."""
        if not self.sharded:
            return True
        device_id = self.device_id(namespace, device)
        return self.owns(device_id) if device_id is not None else self.is_leader()

    def check(self, device_id: str | None, what: str) -> None:
        """Right before an effect on the device: NotOwned unless this replica owns it now. No device id (a Device
        not bound yet) is the leader's."""
        if not self.sharded:
            return
        owned = self.owns(device_id) if device_id else self.is_leader()
        if not owned:
            log.debug("not %s for %s: this replica does not own it now", what, device_id or "an unbound Device")
            raise NotOwned(f"{what} for {device_id or 'an unbound Device'}: not owned by this replica")

    async def label(self, plural: str, metadata: ObjectMeta, device_id: str | None) -> None:
        """Before a status write with several shards: the object carries its shard's label, which the API server's
        fence (controller-fencing.yaml) selects it by; without it the write is refused. A no-op once it does."""
        if self.labels is None or self.ownership.shards <= 1:
            return
        body = {"metadata": {"namespace": metadata.namespace, "name": metadata.name, "labels": metadata.labels or {}}}
        await self.labels.ensure(plural, body, self.shard(device_id) if device_id else 0)

    def check_intent(self, namespace: str, device: str, what: str) -> None:
        if not self.sharded:
            return
        if not self.owns_intent(namespace, device):
            log.debug("not %s for an Intent on %s/%s: this replica does not own its device now", what, namespace,
                      device)
            raise NotOwned(f"{what} for an Intent on Device {namespace}/{device}: not owned by this replica")


OPEN = Doors()  # a controller alone (and the unit tests' parts built without doors): every door open

__all__ = ["OPEN", "Doors", "NotOwned"]
