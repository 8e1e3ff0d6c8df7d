"""Writing what the bridge discovered as DiscoveredDevice objects (api/discovered.py): candidates for a person.

Server-side apply with the field manager `corral-bridge`, owning `spec` only (a person's acceptance is in `status`,
written by `corral devices accept-discovered`). Nothing is written when nothing changed: the bridge reads the object
first and compares the spec without `discoveredAt`, so a restart of the bridge or a re-announced identical
configuration costs one GET, no write, and no new resourceVersion. Writes go out from one task, latest wins: a
device whose configurations arrive one entity at a time is written once they stop changing for a moment.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from corral.api.base import ObjectMeta
from corral.api.capability import CapabilitySpec
from corral.api.codes import GROUP, VERSION
from corral.api.discovered import BridgedTopics, DiscoveredDevice, DiscoveredDeviceSpec, LeftOutPart, contract_hash
from corral.bridge.catalog import Bridged, source_kind, source_name
from corral.bridge.model import Discovered
from corral.contract.text import bounded
from corral.kube.client import APPLY, ApiError, AsyncApi, path_of

log = logging.getLogger(__name__)

FIELD_MANAGER = "corral-bridge"
SETTLE_S = 0.3  # a device's entities are announced one message each: write once they stop changing


def spec_of(device_id: str, discovered: Discovered, bridged: Bridged) -> DiscoveredDeviceSpec:
    return DiscoveredDeviceSpec(
        source=source_name(discovered.key), source_kind=source_kind(discovered.key), device_id=device_id,
        contract=CapabilitySpec.from_contract(bridged.contract), contract_hash=contract_hash(bridged.contract),
        left_out=[LeftOutPart(what=bounded(part.what, 512), reason=bounded(part.reason, 512))
                  for part in bridged.left_out][:128],
        topics=BridgedTopics(command=list(bridged.topics.command), state=list(bridged.topics.state),
                             availability=list(bridged.topics.availability)))


def _comparable(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "discoveredAt"}


class Candidates:
    def __init__(self, api: AsyncApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self._pending: dict[str, DiscoveredDeviceSpec] = {}
        self._wake = asyncio.Event()
        self.written = 0  # writes made (tests read it: nothing written when nothing changed)

    def offer(self, device_id: str, discovered: Discovered, bridged: Bridged) -> None:
        try:
            self._pending[device_id] = spec_of(device_id, discovered, bridged)
        except ValueError as err:  # what discovery said does not fit the kind: nothing to offer a person
            log.warning("device %s cannot be offered as a candidate: %s", device_id, err)
            return
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(SETTLE_S)
            self._wake.clear()
            pending, self._pending = self._pending, {}
            for name, spec in pending.items():
                try:
                    await self._write(name, spec)
                except (TimeoutError, ApiError, OSError) as err:
                    log.warning("writing DiscoveredDevice %s failed (%s); trying again", name, err)
                    self._pending.setdefault(name, spec)
                    self._wake.set()
                    await asyncio.sleep(1.0)

    async def _write(self, name: str, spec: DiscoveredDeviceSpec) -> None:
        path = path_of(GROUP, VERSION, "discovereddevices", self.namespace, name)
        wanted = spec.model_dump(mode="json", exclude_none=True)
        try:
            existing = await self.api.request("GET", path)
        except ApiError as err:
            if err.status != 404:
                raise
            existing = {}
        if _comparable(existing.get("spec") or {}) == _comparable(wanted):
            return
        body = DiscoveredDevice(metadata=ObjectMeta(name=name, namespace=self.namespace),
                                spec=spec.model_copy(update={"discovered_at": datetime.now(UTC)}))
        await self.api.request("PATCH", path, body=body.model_dump(mode="json", exclude_none=True),
                               content_type=APPLY, params={"fieldManager": FIELD_MANAGER, "force": "true"})
        self.written += 1
        log.info("DiscoveredDevice %s/%s written (contract %s)", self.namespace, name, spec.contract_hash[:16])
