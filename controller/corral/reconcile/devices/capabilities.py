"""The cluster's Capabilities as the controller keeps them: made once per accepted contract, collected when unused.

A Capability is made when a Device is trusted with a contract: its first one after enrollment, a later one
that asks for no more trust, or one a person accepted (`contract.trust`). A contract that waits for a person
is named in `status.capability` but gets no object until it is accepted, so a device that re-announces a
changed contract over and over mints nothing cluster-wide. Content-addressed, so identical devices share
one. The controller remembers every Capability it has seen, because a Device's accepted contract is the
Capability named in its `status.acceptedCapability`: after a restart that is what a changed contract is
compared with. One deleted while a Device trusts it is made again from the device's contract.

Collection: a Capability that no Device names (as `capability` or `acceptedCapability`) for `grace`
seconds, and that is older than that, is deleted, with a precondition on the version the controller saw.
Capabilities are cluster-scoped, so only a controller that sees every Device may say one is unused: one that
watches every namespace has them all in its cache; one that watches some namespaces lists Devices in all
namespaces for each round, and collects nothing (saying so once) when RBAC does not let it (the chart's
namespaced mode grants no such list).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from corral.api.capability import Capability, CapabilitySpec
from corral.api.codes import API_VERSION
from corral.contract.model import Contract
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.objects import Kube
from corral.kube.tasks import cancel_all
from corral.kube.typed import Body, Malformed, parse
from corral.reconcile.devices.cache import DeviceCache

log = logging.getLogger(__name__)


class Capabilities:
    def __init__(self, kube: Kube, recorder: EventRecorder, devices: DeviceCache, grace_s: float,
                 sees_every_namespace: bool, announced: Callable[[], set[str]] = set) -> None:
        self.kube = kube
        self.announced = announced  # what devices announced and judged, before any status names it
        self.recorder = recorder
        self.devices = devices
        self.grace_s = grace_s
        self.sees_every_namespace = sees_every_namespace  # else each round lists Devices in all namespaces
        self.collecting = True  # False once RBAC refused that list: said once, tried again each round
        self._specs: dict[str, CapabilitySpec] = {}
        self._seen: dict[str, Capability] = {}  # name -> the object as last listed (for the delete precondition)
        self._unused_since: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def prime(self) -> None:
        """Every Capability there is, before the first contract is judged."""
        for body in await self.kube.list_capabilities():
            self._remember(body)

    def contract(self, name: str | None, device_id: str) -> Contract | None:
        spec = self._specs.get(name or "")
        return spec.contract(device_id) if spec is not None else None

    async def ensure(self, name: str, contract: Contract, device_id: str) -> None:
        """The Capability for this contract exists (made now, with an Event, if it did not)."""
        if name in self._specs:
            return
        spec = CapabilitySpec.from_contract(contract)
        body = {"apiVersion": API_VERSION, "kind": "Capability", "metadata": {"name": name},
                "spec": spec.model_dump(mode="json", exclude_none=True)}
        if await self.kube.create_capability(body):
            self.recorder.post(ObjectRef(API_VERSION, "Capability", name, None, None), "Created", "Register",
                               f"Contract of {contract.model} {contract.fw}, trusted for device {device_id}")
        self._specs[name] = spec

    def _remember(self, body: Body) -> None:
        try:
            capability = parse(Capability, body)
        except Malformed as err:
            log.warning("%s; it is ignored", err)
            return
        name = capability.metadata.name or ""
        self._specs[name] = capability.spec
        self._seen[name] = capability

    # ---- collection -----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Collect unused Capabilities: the leader's work alone (two replicas would race to delete)."""
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.create_task(self._run(), name="corral-capability-gc")

    async def stop(self) -> None:
        await cancel_all([self._task])
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, min(self.grace_s / 4, 300.0)))
            try:
                await self.collect_unused()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the API server was away: next round
                log.warning("collecting unused Capabilities failed: %s", err)

    async def in_use(self) -> set[str] | None:
        """Every Capability a Device names, or None when this controller cannot see every Device."""
        used = set(self.announced())
        if self.sees_every_namespace:
            # Refused Devices too: one whose spec its model refuses still names the Capability it trusted.
            bodies = [body for _, body in self.devices.items()] + [r.body for r in self.devices.refused.values()]
        else:
            try:
                bodies = await self.kube.list_objects("devices", ())
            except ApiError as err:
                if err.status not in (401, 403):
                    raise
                if self.collecting:
                    log.warning("not collecting unused Capabilities: this controller watches some namespaces and "
                                "may not list Devices in all of them (%s), so it cannot know that no Device uses one",
                                err.message)
                self.collecting = False
                return None
            self.collecting = True
        for body in bodies:
            used.update(named_by(body))
        return used

    async def collect_unused(self) -> list[str]:
        """Delete the Capabilities unused for the grace period; the names deleted."""
        listed = await self.kube.list_capabilities()
        self._seen = {}
        for body in listed:
            self._remember(body)
        for gone in set(self._specs) - set(self._seen):
            self._specs.pop(gone, None)  # deleted by someone else: made again if a Device trusts it
        used = await self.in_use()
        if used is None:
            return []
        now, deleted = time.monotonic(), []
        for name, capability in list(self._seen.items()):
            if name in used:
                self._unused_since.pop(name, None)
                continue
            since = self._unused_since.setdefault(name, now)
            meta = capability.metadata
            created = meta.creation_timestamp or datetime.now(UTC)
            old_enough = (datetime.now(UTC) - created).total_seconds() >= self.grace_s
            if now - since < self.grace_s or not old_enough:
                continue
            if await self.kube.delete_capability(name, meta.uid or "", meta.resource_version or ""):
                deleted.append(name)
                self.recorder.post(ObjectRef(API_VERSION, "Capability", name, None, None), "Collected", "Delete",
                                   f"No Device has used Capability {name} for {self.grace_s:g} s; deleted.")
            self._seen.pop(name, None)
            self._specs.pop(name, None)
            self._unused_since.pop(name, None)
        return deleted


def named_by(body: Body) -> set[str]:
    """The Capabilities a Device's status names. Read from the body: Devices listed in every namespace come as
    bodies, and a Device whose spec its model refuses still names the Capability it trusted."""
    status = body.get("status") or {}
    return {name for name in (status.get("capability"), status.get("acceptedCapability")) if name}
