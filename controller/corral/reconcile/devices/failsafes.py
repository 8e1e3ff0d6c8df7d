"""After a failsafe: which targets are driven again, which are left at the failsafe value, and what people are told.

The firmware moves an actuator to its contract's failsafe value when it loses the controller's heartbeat. The
target is then driven again like any drift, unless it was set longer ago than `redrive_max_age_s` (by the Device's
managedFields): then it stays at the failsafe value until a person sets it anew (condition Failsafe, reason
TargetTooOld, and an Event). Apart from the reconciler because it is one rule with its own words, read in three
places (the plan leaves such actuators, the Events, the condition).
"""

from __future__ import annotations

from datetime import UTC, datetime

from corral.api.device import Device
from corral.contract.values import same_value
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.notices import DeviceNotices, as_json
from corral.reconcile.devices.runtime import DeviceRuntime
from corral.reconcile.devices.targets import target_set_at


class Failsafes:
    def __init__(self, config: ControllerConfig, notices: DeviceNotices) -> None:
        self.config = config
        self.notices = notices

    def seed_reached(self, rt: DeviceRuntime, device: Device, epoch: int) -> None:
        """A fresh runtime (a restart): the targets status shows reached at this generation and epoch were
        driven (or needed nothing), so a difference the device reports now is drift, not a pending change."""
        status = device.status
        generation = device.metadata.generation or 1
        if status is None or status.observed_generation != generation:
            return
        reached = rt.reached_set((device.metadata.uid or "", generation, epoch))
        for actuator, wanted in device.spec.target.items():
            if actuator in status.reported and same_value(status.reported[actuator], wanted):
                reached.add(actuator)

    def too_old(self, rt: DeviceRuntime, device: Device) -> dict[str, float]:
        """Actuators at their failsafe value whose target was set longer ago than the re-drive age: id -> age in s.
        A target of unknown age (no managedFields entry owns it) is driven again."""
        old: dict[str, float] = {}
        for actuator, report in rt.failsafe.items():
            set_at = target_set_at(device, actuator) if actuator in device.spec.target and report.error is None \
                else None
            if set_at is not None:
                age = (datetime.now(UTC) - set_at).total_seconds()
                if age > self.config.redrive_max_age_s:
                    old[actuator] = age
        return old

    def announce(self, rt: DeviceRuntime, device: Device) -> None:
        """An Event and a record per failsafe the device reported, and per target left at it."""
        target = device.spec.target
        too_old = self.too_old(rt, device)
        for actuator, report in sorted(rt.failsafe.items()):
            key = f"{actuator}/{report.ts}"
            self.notices.once(rt, device, f"failsafe/{key}", "Failsafe", "Observe",
                              f"The device moved {report.cause(actuator)}.", "Warning",
                              fact=("device.failsafe", {"actuator": actuator,
                                                        **report.model_dump(mode="json", exclude_none=True)}))
            if actuator in too_old:
                self.notices.once(rt, device, f"failsafe-too-old/{key}", "FailsafeTargetTooOld", "Hold",
                                  self._note(actuator, target[actuator], too_old[actuator]), "Warning",
                                  fact=("target.not_redriven", {"actuator": actuator, "value": target[actuator],
                                                                "ageS": round(too_old[actuator], 1),
                                                                "maxAgeS": self.config.redrive_max_age_s}))

    def condition(self, rt: DeviceRuntime, device: Device) -> tuple[str, str] | None:
        """(reason, message) of condition Failsafe while an actuator sits at its failsafe value."""
        if not rt.failsafe:
            return None
        target = device.spec.target
        too_old = self.too_old(rt, device)
        parts = []
        for actuator, report in sorted(rt.failsafe.items()):
            if actuator in too_old:
                then = self._note(actuator, target[actuator], too_old[actuator])
            elif actuator in target:
                then = f"spec.target.{actuator}={as_json(target[actuator])} is driven again where the interlocks allow it."
            else:
                then = "it has no target to go back to."
            parts.append(f"The device moved {report.cause(actuator)}; {then}")
        return ("TargetTooOld" if too_old else "FailsafeApplied"), " ".join(parts)

    def _note(self, actuator: str, value: object, age_s: float) -> str:
        max_age_s = self.config.redrive_max_age_s
        return (f"spec.target.{actuator}={as_json(value)} was set {_duration(age_s)} ago, longer than the re-drive "
                f"age ({_duration(max_age_s)}, corral run --redrive-max-age): it is not driven again by itself. Set it "
                "anew to drive it: an Intent for it, or a change to spec.target.")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
