"""The device side as the Intent reconciler sees it: a narrow port, read-only but for three verbs.

The Intent reconciler never touches `DeviceRuntime` fields or the Device cache. It asks for a
`DeviceView` (an immutable snapshot of one Device and what MQTT told of its device), reads a device's
state afresh, and executes through `pin` + `apply_target`: the command is pinned first, then the
target is applied, and the device reconciler does the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from opentelemetry.context import Context

from corral.api.device import Device
from corral.contract.model import Contract
from corral.decide.evidence import Evidence, Received
from corral.devices.commands import CommandTimeout
from corral.devices.telemetry import MetricRing, Reading
from corral.kube.cache import key_of
from corral.kube.typed import Body
from corral.kube.workqueue import WorkQueue
from corral.obs.crashpoints import TARGET_APPLIED, crash_point
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.driver import Driver, Pin
from corral.reconcile.devices.listening import Listening
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.devices.targets import TargetApplier
from corral.reconcile.devices.trust import ContractTrust


@dataclass(frozen=True)
class DeviceView:
    """One Device and, if it is the one bound to its device id, what the controller knows of the device.

    `body` is the Device as the API server sent it, for the readers that still take bodies; `device` its model."""

    body: Body
    device_id: str | None
    bound: bool  # this Device is the one that controls its device id (the oldest claim)
    known: bool  # the device has announced itself since the controller started
    contract: Contract | None = None
    online: bool | None = None
    reported: Mapping[str, Any] = field(default_factory=dict)
    latest: Mapping[str, Reading] = field(default_factory=dict)
    hold: str | None = None  # why the device's changed contract waits for a person
    device: Device | None = None

    @property
    def exists(self) -> bool:
        return self.bound and self.known


class DevicePort(Protocol):
    def view(self, namespace: str, name: str) -> DeviceView | None: ...

    def still_listening(self) -> bool: ...

    def evidence(self, citations: Iterable[tuple[str, str, int]]) -> Evidence: ...

    async def read_state(self, device_id: str) -> dict[str, Any]: ...

    def pin(self, device_id: str, actuator: str, value: Any, command_id: str, intent: str,
            trace: Context | None) -> Pin: ...

    def release(self, pin: Pin) -> None: ...

    def release_command(self, device_id: str, command_id: str) -> None: ...

    async def apply_target(self, pin: Pin, device: Body, intent: str) -> Body: ...


class FleetPort:
    """The DevicePort of the running controller."""

    def __init__(self, fleet: Fleet, devices: DeviceCache, driver: Driver, applier: TargetApplier,
                 queue: WorkQueue[str], notices: DeviceNotices, listening: Listening, trust: ContractTrust) -> None:
        self.fleet = fleet
        self.trust = trust
        self.devices = devices
        self.driver = driver
        self.applier = applier
        self.queue = queue
        self.notices = notices
        self.listening = listening
        self.started = datetime.now(UTC)  # reading buffers are in memory: nothing older can be matched

    def view(self, namespace: str, name: str) -> DeviceView | None:
        device, body = self.devices.device((namespace, name)), self.devices.get((namespace, name))
        if device is None or body is None:
            return None
        device_id = device.spec.device_id
        bound = next(iter(self.devices.claims(device_id)), None) is device
        rt = self.fleet.get(device_id) if bound else None
        if rt is None:
            return DeviceView(body, device_id, bound, known=False, device=device)
        # Decisions judge by the contract with the cluster's risk floors, never lower than the device claims.
        contract = self.trust.effective(rt.contract, device) if rt.contract is not None else None
        return DeviceView(body, device_id, bound, known=True, contract=contract, online=rt.online,
                          reported=dict(rt.reported), latest=dict(rt.buffer.latest),
                          hold="; ".join(rt.hold) if rt.hold else None, device=device)

    def still_listening(self) -> bool:
        return self.listening.still_listening()

    def rings(self, device_id: str) -> Mapping[str, MetricRing]:
        rt = self.fleet.get(device_id)
        return rt.buffer.rings if rt is not None else {}

    def evidence(self, citations: Iterable[tuple[str, str, int]]) -> Evidence:
        """What the buffers hold for these (device id, metric, ts) citations: that very sample, and the freshest."""
        cited: dict[tuple[str, str, int], Received] = {}
        freshest: dict[tuple[str, str], Received] = {}
        intervals: dict[tuple[str, str], float] = {}
        overrides: dict[tuple[str, str], float] = {}
        for device_id, metric, ts in citations:
            ring = self.rings(device_id).get(metric)
            found = ring.first_with_ts(ts) if ring is not None else None
            newest = ring.newest() if ring is not None else None
            if found is not None:
                cited[(device_id, metric, ts)] = Received(found.ts, found.received_ms, found.value)
            if newest is not None:
                freshest[(device_id, metric)] = Received(newest.ts, newest.received_ms, newest.value)
            interval, override = self._freshness_of(device_id, metric)
            if interval is not None:
                intervals[(device_id, metric)] = interval
            if override is not None:
                overrides[(device_id, metric)] = override
        return Evidence(cited, freshest, self.started, intervals, overrides)

    def _freshness_of(self, device_id: str, metric: str) -> tuple[float | None, float | None]:
        """The metric's publish interval in the contract the device is trusted with (a held contract's longer
        interval does not count until a person accepts it), and a person's limit on its Device."""
        rt = self.fleet.get(device_id)
        contract = rt.contract if rt is not None else None
        if rt is not None and rt.hold:
            contract = self.trust.capabilities.contract(rt.accepted_capability, device_id)
        sensor = next((s for s in contract.sensors if s.metric == metric), None) if contract is not None else None
        device = next(iter(self.devices.claims(device_id)), None)
        override = (device.spec.freshness or {}).get(metric) if device is not None else None
        return (sensor.interval_s if sensor is not None else None,
                float(override) if isinstance(override, int | float) and not isinstance(override, bool) else None)

    async def read_state(self, device_id: str) -> dict[str, Any]:
        """The device's full state, asked from the device now (get_state); TimeoutError if it does not answer."""
        try:
            state = await self.driver.get_state(device_id)
        except CommandTimeout as err:
            raise TimeoutError(str(err)) from None
        rt = self.fleet.get(device_id)
        if rt is not None:
            self.notices.state_changed(rt, rt.report(state), "read by an Intent")
        return state

    def pin(self, device_id: str, actuator: str, value: Any, command_id: str, intent: str,
            trace: Context | None) -> Pin:
        return self.driver.expectations.pin(device_id, actuator, value, command_id, intent, trace)

    def release(self, pin: Pin) -> None:
        self.driver.expectations.release(pin)
        self.queue.add(pin.device_id)  # what the pin held back may be driven now

    def release_command(self, device_id: str, command_id: str) -> None:
        self.driver.expectations.release_command(device_id, command_id)
        self.queue.add(device_id)

    async def apply_target(self, pin: Pin, device: Body, intent: str) -> Body:
        """Set the Device's target to the pin's value; the device reconciler then sends the pinned command."""
        latest = self.devices.get(key_of(device)) or device
        written = await self.applier.apply(latest, pin.actuator, pin.value, intent)
        crash_point(TARGET_APPLIED)
        pin.applied_generation = int(written["metadata"]["generation"])
        # The device reconciler acts on the answer now, not one watch hop later.
        self.devices.upsert(written)
        self.queue.add(pin.device_id)
        return written
