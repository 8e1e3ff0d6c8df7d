"""The shard label an owner puts on a Device or Intent before its first status write, when devices are sharded.

The API server fences status writes per shard (charts/corral/templates/controller-fencing.yaml): a binding per
shard selects objects by the label `corral.dev/shard` and admits only the holder of that shard's Lease, and an
object without the label refuses every status write of the controller. A selector cannot hash a device id, so
the owner writes the answer of `shard_of` into the object. With one shard the single binding selects every
object: nothing is labelled.
"""

from __future__ import annotations

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.kube.client import APPLY, path_of
from corral.kube.objects import Kube
from corral.kube.typed import Body

SHARD_LABEL = "corral.dev/shard"
SHARDS_MANAGER = "corral-shards"  # owns only this label, so no other writer's apply takes it away or conflicts

KINDS = {"devices": "Device", "intents": "Intent"}


class ShardLabels:
    def __init__(self, kube: Kube, shards: int) -> None:
        self.kube = kube
        self.shards = shards

    async def ensure(self, plural: str, body: Body, shard: int) -> Body | None:
        """Label `body` (a Device or Intent as last seen) with `shard` unless it already says so, or there is one
        shard. Returns the object as the API server now has it, for the caller's cache; None when nothing was
        written. Not fenced itself (the label is metadata, not status), so the owner may write it at any time."""
        if self.shards <= 1:
            return None
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} is outside 0..{self.shards - 1} ({self.shards} shards)")
        kind = KINDS.get(plural)
        if kind is None:
            raise ValueError(f"only {', '.join(KINDS)} carry a shard label, not {plural!r}")
        metadata = body.get("metadata") or {}
        if (metadata.get("labels") or {}).get(SHARD_LABEL) == str(shard):
            return None
        patch = {"apiVersion": API_VERSION, "kind": kind,
                 "metadata": {"name": metadata["name"], "labels": {SHARD_LABEL: str(shard)}}}
        # force: the shard of an object is the controller's to say; a label someone else set would leave the
        # object fenced by the wrong Lease, or by none.
        return await self.kube.api.request(
            "PATCH", path_of(GROUP, VERSION, plural, metadata["namespace"], metadata["name"]), body=patch,
            content_type=APPLY, params={"fieldManager": SHARDS_MANAGER, "force": "true"})
