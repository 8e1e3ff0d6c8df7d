"""A Device's status, built from what the controller knows now and written only when it changed.

`status.py` holds the pure rules (conditions, coalescing); this is their I/O side: gather the facts from the
runtime, the plan, the guards, the failsafes and the on-time limits into `status.Observed`, ask `status.to_write` whether the record
already says it, and write with server-side apply. The answer goes into the cache at once, so the controller
never reacts to its own write when its watch event comes.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from corral.api.device import Device, DeviceStatus, InterlockedTarget
from corral.devices.plan import Plan
from corral.kube.objects import Kube
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.cache import DeviceCache, device_id_of, key_of_device
from corral.reconcile.devices.failsafes import Failsafes
from corral.reconcile.devices.holds import TargetHolds
from corral.reconcile.devices.onlimits import OnTimeLimits
from corral.reconcile.devices.runtime import DeviceRuntime
from corral.reconcile.devices.status import (
    Observed,
    bridged_words,
    device_status,
    recorded,
    remember_write,
    sensor_readings,
    sensors_due,
    serialize,
    sync_verdict,
    to_write,
)
from corral.reconcile.doors import OPEN, Doors

log = logging.getLogger(__name__)


def command_epoch(rt: DeviceRuntime, device: Device) -> int:
    """The re-drive epoch in effect: ours if we just raised it, else what status records."""
    status = device.status
    rt.command_epoch = max(rt.command_epoch, int((status.command_epoch if status is not None else None) or 0))
    return rt.command_epoch


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class StatusWriter:
    doors: Doors = OPEN  # the controller's, set where it is wired: only the device's owner writes its status

    def __init__(self, config: ControllerConfig, kube: Kube, devices: DeviceCache, failsafes: Failsafes,
                 holds: TargetHolds, limits: OnTimeLimits | None = None) -> None:
        self.config = config
        self.kube = kube
        self.devices = devices
        self.failsafes = failsafes
        self.holds = holds
        self.limits = limits or OnTimeLimits(failsafes.notices)

    def status(self, rt: DeviceRuntime, device: Device, result: Plan | None,
               interlocked: tuple[InterlockedTarget, ...] | None = None, lease_held: str | None = None
               ) -> DeviceStatus:
        """interlocked: the targets held now; None (not judged this time): those on record stay held."""
        # Judged against the newest copy (our own last write is in the cache at once), not the one the caller
        # read: a condition on record in between (Failsafe TargetTooOld) would otherwise be dropped, not cleared.
        newest = self.devices.device(key_of_device(device)) if self.devices is not None else None
        device = newest or device
        previous = recorded(device)
        if interlocked is None:
            interlocked = tuple(previous.interlocked_targets or ()) if previous is not None else ()
        sensors = {s.metric: s for s in rt.contract.sensors} if rt.contract else {}
        if sensors_due(rt.memory, rt.buffer.latest, sensors, self.config.coalescing, time.monotonic()):
            readings = sensor_readings(rt.buffer.latest, sensors)
        else:
            readings = dict(previous.sensors) if previous is not None else {}
        accepted = rt.contract is not None
        observed = Observed(
            generation=device.metadata.generation,
            online=bool(rt.online),
            capability=rt.capability if accepted else None,
            accepted_capability=(rt.accepted_capability if rt.accepted_for == device.metadata.uid
                                 else previous.accepted_capability if previous is not None else None),
            hold=rt.hold if accepted else (),
            hold_reason=rt.hold_reason or "ChangeNeedsAcceptance",
            device=device.metadata.name or "",
            contract_error=rt.contract_error,
            reported=rt.reported,
            sensors=readings,
            command_epoch=command_epoch(rt, device),
            verdict=sync_verdict(result, bool(rt.online), rt.failures) if accepted and result is not None else None,
            interlocks=self.holds.guarding(device),
            interlocked=interlocked,
            failsafe=self.failsafes.condition(rt, device) if accepted else None,
            max_on=self.limits.condition(rt, device) if accepted else None,
            lease_held=lease_held,
            bridged=(bridged_words(device.spec.bridge.source, device.spec.bridge.left_out)
                     if device.spec.bridge is not None else None),
        )
        return device_status(observed, previous, now())

    async def write(self, rt: DeviceRuntime | None, device: Device, status: DeviceStatus, reason: str) -> None:
        """Write status unless the record (the newest copy cached) already says it."""
        device = self.devices.device(key_of_device(device)) or device
        previous = recorded(device)
        moment = time.monotonic()
        last_seen_due = rt is not None and moment - rt.memory.last_seen_written_at >= self.config.last_seen_interval_s
        decided = to_write(status, previous, rt.last_seen if rt is not None else None, last_seen_due)
        if decided is None:
            return
        status, why = decided
        namespace, name = key_of_device(device)
        self.doors.check(device_id_of(device), "writing Device status")
        await self.doors.label("devices", device.metadata, device_id_of(device))
        log.debug("status write %s/%s (%s)", namespace, name, reason)
        written = await self.kube.apply_status("devices", namespace, name, "Device", serialize(status),
                                               "last-seen" if why == "last-seen" else reason)
        self.devices.upsert(written)  # a status-only change: nothing to reconcile for it
        if rt is not None:
            remember_write(rt.memory, status, previous, self.config.coalescing, moment)
