"""A Device's status: built from what the controller observed, and written only when it changed. Pure.

`device_status()` turns the observed facts into the typed `DeviceStatus`; `waiting_status()` and
`duplicate_status()` cover a Device whose device has not announced itself and one that lost a duplicate
claim. `to_write()` compares with what is on record and says whether (and why) to write, applying the
coalescing rules that keep Kubernetes from becoming a time-series database:

- `lastSeen` rides along with every other write and is refreshed alone at most once per interval;
- sensor readings are rewritten when `sensors_due()` says so (interval, deadband, minimum gap, burst
  budget: `devices.telemetry.Coalescing`), otherwise the previous readings stand.

No clock of its own and no I/O: the reconciler passes the time in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from corral.api.device import Device, DeviceStatus, GuardingInterlock, InterlockedTarget, SensorReading
from corral.contract.model import Sensor
from corral.contract.values import shown
from corral.devices.plan import Plan
from corral.devices.telemetry import Coalescing, Reading
from corral.kube.conditions import Wanted, merge
from corral.reconcile.devices.runtime import StatusMemory


@dataclass(frozen=True)
class Verdict:
    """Whether the device is at its target, and why not."""

    in_sync: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What a Device's status is built from."""

    generation: int | None
    online: bool
    capability: str | None  # the announced contract's Capability; None when refused
    contract_error: str | None
    reported: Mapping[str, Any]
    sensors: Mapping[str, SensorReading]
    command_epoch: int
    verdict: Verdict | None  # None: not planned yet
    accepted_capability: str | None = None  # the Capability the controller trusts (contract.trust)
    hold: tuple[str, ...] = ()  # why the announced contract waits for a person
    hold_reason: str = "ChangeNeedsAcceptance"  # the ContractAccepted condition's reason while held
    device: str = ""  # the Device's name, for what people are told to run
    interlocks: tuple[GuardingInterlock, ...] = ()  # the rules that guard the device
    interlocked: tuple[InterlockedTarget, ...] = ()  # targets an interlock forbade: not driven
    failsafe: tuple[str, str] | None = None  # (reason, message) while actuators sit at failsafe values
    max_on: tuple[str, str] | None = None  # (reason, message) while the device reports on-time limits that acted
    lease_held: str | None = None  # targets not driven while another holds the Device's lease: what the condition says
    bridged: str | None = None  # a bridged Device: what its condition Bridged says (api.device.BridgeBinding)


def parse(status: Mapping[str, Any] | None) -> DeviceStatus | None:
    """The status on record as a model; None when there is none, or when it does not parse (then it is
    rewritten whole, which is what a status in an unknown shape deserves)."""
    if not status:
        return None
    try:
        return DeviceStatus.model_validate(status)
    except ValidationError:
        return None


def recorded(device: Device) -> DeviceStatus | None:
    """The Device's status on record; None when it has none (or none the model could read: see `cache`), as
    `parse` says of a body's status."""
    status = device.status
    return status if status is not None and status.model_fields_set else None


def serialize(status: DeviceStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def sync_verdict(result: Plan | None, online: bool, failures: int) -> Verdict:
    if result is None:
        return Verdict(False, "Unknown", "Not planned yet.")
    if result.invalid:
        return Verdict(False, "InvalidTarget", "; ".join(f"{a}: {why}" for a, why in sorted(result.invalid.items())))
    if result.left:
        return Verdict(False, "FailsafeTargetTooOld",
                       f"{', '.join(result.left)} stayed at the failsafe value: the target is older than the "
                       "re-drive age and is not driven again by itself (condition Failsafe).")
    if result.limited:
        return Verdict(False, "OnTimeLimit",
                       f"{', '.join(result.limited)} switched off by its on-time limit: the target is not driven "
                       "again by itself (condition OnTimeLimit).")
    if result.drifted:
        return Verdict(False, "Drifted",
                       f"{', '.join(result.drifted)} changed on the device; drift policy Observe leaves it.")
    if result.commands:
        pending = ", ".join(f"{c.actuator}={shown(c.value)}" for c in result.commands)
        if not online:
            return Verdict(False, "DeviceOffline", f"Waiting for the device to come online to apply {pending}.")
        if failures:
            return Verdict(False, "Retrying", f"Applying {pending} (attempt {failures + 1}).")
        return Verdict(False, "Pending", f"Applying {pending}.")
    return Verdict(True, "InSync", "Reported state matches the target.")


def bridged_words(source: str, left_out: Sequence[str] = ()) -> str:
    """What a bridged Device's condition Bridged says: whom it speaks through, what differs from a native one, and
    what its source offers that the bridge could not map (the device's own words, quoted as data)."""
    words = (f"bridged from {source}; a person's acceptance stands in for the firmware signature; no device-side "
             "clamp: the bridge validates and clamps")
    if left_out:
        words += "; left out (not offered): " + "; ".join(json.dumps(part, ensure_ascii=False) for part in left_out)
    return words


def device_status(observed: Observed, previous: DeviceStatus | None, now: datetime) -> DeviceStatus:
    generation = observed.generation
    wanted: list[Wanted] = []
    in_sync = False
    if observed.capability is None:
        message = observed.contract_error or "no contract"
        wanted.append(Wanted("ContractValid", "False", "Refused", message, generation))
        wanted.append(Wanted("Ready", "False", "ContractInvalid", "The device is inert: " + message, generation))
    else:
        verdict = observed.verdict or sync_verdict(None, observed.online, 0)
        if observed.hold and observed.accepted_capability is None:
            # A bridged Device's first contract, not the one a person accepted (contract.trust.first_bridged).
            message = (f"{'; '.join(observed.hold)}. Nothing is sent and Intents wait until the bridge announces the "
                       f"accepted contract, or a person accepts this one: corral devices accept-contract "
                       f"{observed.device}.")
            wanted.append(Wanted("ContractAccepted", "False", observed.hold_reason, message, generation))
            verdict = Verdict(False, "ContractHold", "Held until a person accepts the bridged contract.")
        elif observed.hold:
            message = (f"The announced contract (Capability {observed.capability}) asks for more trust than the "
                       f"accepted one ({observed.accepted_capability}): {'; '.join(observed.hold)}. Nothing is sent "
                       f"and Intents wait until a person accepts it: corral devices accept-contract {observed.device}.")
            wanted.append(Wanted("ContractAccepted", "False", observed.hold_reason, message, generation))
            verdict = Verdict(False, "ContractHold", "Held until a person accepts the changed contract.")
        else:
            wanted.append(Wanted("ContractAccepted", "True", "Accepted",
                                 f"Capability {observed.accepted_capability or observed.capability}", generation))
        if observed.bridged:
            wanted.append(Wanted("Bridged", "True", "Accepted", observed.bridged, generation))
        verdict = _held_conditions(observed, previous, verdict, wanted)
        in_sync = verdict.in_sync
        wanted.append(Wanted("ContractValid", "True", "Accepted", f"Capability {observed.capability}", generation))
        wanted.append(Wanted("InSync", "True" if in_sync else "False", verdict.reason, verdict.message, generation))
        if observed.online and in_sync:
            wanted.append(Wanted("Ready", "True", "Ready", "Online and at its target.", generation))
        elif observed.online:
            wanted.append(Wanted("Ready", "False", verdict.reason, verdict.message, generation))
        else:
            wanted.append(Wanted("Ready", "False", "Offline", "The device is offline; reported state and sensors "
                                                                "are its last known values.", generation))
    return DeviceStatus(
        online=observed.online,
        stale=not observed.online,
        last_seen=previous.last_seen if previous is not None else None,
        capability=observed.capability,
        # Kept through a refused contract: what a person trusted must not be forgotten by a device's refusal. Held
        # with nothing accepted yet (a bridged Device's first contract, not the accepted one): none is trusted.
        accepted_capability=observed.accepted_capability or (None if observed.hold else observed.capability),
        reported=dict(observed.reported),
        sensors=dict(observed.sensors),
        in_sync=in_sync,
        conditions=merge(previous.conditions if previous else [], wanted, now),
        interlocks=list(observed.interlocks) or None,
        interlocked_targets=list(observed.interlocked) or None,
        observed_generation=generation,
        command_epoch=observed.command_epoch or None,
    )


def _held_conditions(observed: Observed, previous: DeviceStatus | None, verdict: Verdict, wanted: list[Wanted]
                     ) -> Verdict:
    """The conditions Interlocked, Leased, Failsafe and OnTimeLimit (appended to `wanted`), and the verdict they leave: a held
    target keeps a device that is otherwise at its target from being in sync."""
    generation = observed.generation
    before = previous.conditions if previous else []
    if observed.interlocked:
        message = interlocked_message(observed.interlocked)
        wanted.append(Wanted("Interlocked", "True", "InterlockForbids", message, generation))
        if verdict.in_sync:  # else what else keeps it from its target is said; this condition says the rest
            verdict = Verdict(False, "Interlocked", message)
    elif observed.interlocks:
        wanted.append(Wanted("Interlocked", "False", "NoTargetHeld",
                             f"Guarded by {', '.join(i.name for i in observed.interlocks)}; no target is held.",
                             generation))
    if observed.lease_held:
        wanted.append(Wanted("Leased", "True", "TargetHeldForLease", observed.lease_held, generation))
        if verdict.in_sync:
            verdict = Verdict(False, "Leased", observed.lease_held)
    elif any(c.type == "Leased" for c in before):  # once there, it stays
        wanted.append(Wanted("Leased", "False", "LeaseEnded", "No target is held for a lease.", generation))
    if observed.failsafe is not None:
        wanted.append(Wanted("Failsafe", "True", observed.failsafe[0], observed.failsafe[1], generation))
    elif any(c.type == "Failsafe" for c in before):  # once there, it stays (as Cleared)
        wanted.append(Wanted("Failsafe", "False", "Cleared", "No actuator sits at its failsafe value.", generation))
    if observed.max_on is not None:
        wanted.append(Wanted("OnTimeLimit", "True", observed.max_on[0], observed.max_on[1], generation))
    elif any(c.type == "OnTimeLimit" for c in before):  # once there, it stays (as Cleared)
        wanted.append(Wanted("OnTimeLimit", "False", "Cleared",
                             "No actuator is reported switched off by its on-time limit since it was last set.",
                             generation))
    return verdict


def interlocked_message(held: tuple[InterlockedTarget, ...]) -> str:
    """What the Interlocked condition says: which targets are held, by which rule, and how they are driven again."""
    parts = [f"spec.target.{h.actuator}={json.dumps(h.value)} is not driven: Interlock {h.interlock} forbade it "
             f"({h.message})" for h in held]
    return ("; ".join(parts) + ". A held target is not driven even once the rule holds again: change the target, or "
            "ask for it with an Intent, which the interlocks judge anew.")


def waiting_status(previous: DeviceStatus | None, generation: int | None, now: datetime) -> DeviceStatus:
    """Not heard of since the controller started: keep what is known, marked stale."""
    wanted = [
        Wanted("ContractValid", "Unknown", "WaitingForDevice",
               "No contract yet: the device has not announced itself on MQTT.", generation),
        Wanted("Ready", "False", "WaitingForDevice", "The device has not announced itself.", generation),
    ]
    kept = previous or DeviceStatus()
    return DeviceStatus(
        online=False, stale=True, in_sync=False, last_seen=kept.last_seen, capability=kept.capability,
        accepted_capability=kept.accepted_capability, reported=kept.reported, sensors=kept.sensors, command_epoch=kept.command_epoch,
        conditions=merge(kept.conditions, wanted, now), observed_generation=generation,
        interlocks=kept.interlocks, interlocked_targets=kept.interlocked_targets,
    )


def duplicate_status(previous: DeviceStatus | None, generation: int | None, message: str, now: datetime
                     ) -> DeviceStatus:
    wanted = [
        Wanted("Bound", "False", "DuplicateDeviceId", message, generation),
        Wanted("Ready", "False", "DuplicateDeviceId", message, generation),
    ]
    return DeviceStatus(conditions=merge(previous.conditions if previous else [], wanted, now),
                        observed_generation=generation)


def malformed_status(previous: DeviceStatus | None, generation: int | None, message: str, now: datetime
                     ) -> DeviceStatus:
    """A Device its model refuses: what is on record stays, and Ready says why it is not driven."""
    kept = previous or DeviceStatus()
    wanted = [Wanted("Ready", "False", "Malformed", message, generation)]
    return kept.model_copy(update={"conditions": merge(kept.conditions, wanted, now)})


def to_write(status: DeviceStatus, previous: DeviceStatus | None, last_seen: datetime | None,
             last_seen_due: bool) -> tuple[DeviceStatus, str] | None:
    """What to write and why, or None when the record already says it.

    `last_seen` is when the device was last heard; it is written with any other change, and alone only
    when `last_seen_due` (the refresh interval passed).
    """
    if previous is None or status.model_copy(update={"last_seen": None}) != previous.model_copy(
            update={"last_seen": None}):
        fresh = _seconds(last_seen) if last_seen is not None else status.last_seen
        return status.model_copy(update={"last_seen": fresh}), "changed"
    if last_seen_due and last_seen is not None and _seconds(last_seen) != previous.last_seen:
        return status.model_copy(update={"last_seen": _seconds(last_seen)}), "last-seen"
    return None


def sensors_due(memory: StatusMemory, latest: Mapping[str, Reading], sensors: Mapping[str, Sensor],
                rule: Coalescing, now: float) -> bool:
    """Whether the latest readings deserve a status write now (`now`: a monotonic clock)."""
    current = {metric: sample.value for metric, sample in latest.items()}
    return rule.should_write(memory.sensors_written, dict[str, object](current), now - memory.sensors_written_at, dict(sensors),
                             memory.early_writes.available(rule, now))


def sensor_readings(latest: Mapping[str, Reading], sensors: Mapping[str, Sensor]) -> dict[str, SensorReading]:
    return {
        metric: SensorReading(value=sample.value, unit=sensors[metric].unit if metric in sensors else "",
                              timestamp=datetime.fromtimestamp(sample.ts / 1000, UTC))
        for metric, sample in sorted(latest.items())
    }


def remember_write(memory: StatusMemory, written: DeviceStatus, previous: DeviceStatus | None, rule: Coalescing,
                   now: float) -> None:
    """After a write: start the coalescing intervals of what it changed."""
    if previous is None or written.last_seen != previous.last_seen:
        memory.last_seen_written_at = now
    before = previous.sensors if previous is not None else {}
    if written.sensors != before:
        memory.early_writes.spend(rule, now)
        memory.sensors_written = {metric: reading.value for metric, reading in written.sensors.items()}
        memory.sensors_written_at = now


def _seconds(moment: datetime) -> datetime:
    """Kubernetes times have second precision; so does lastSeen, or every message would be a change."""
    return moment.astimezone(UTC).replace(microsecond=0)
