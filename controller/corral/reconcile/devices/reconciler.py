"""Reconciling one device: its Device, its contract mirrored as a Capability, plan, drive, write status.

`DeviceReconciler.reconcile(device_id)` is called by the work queue, one device at a time, and answers
with a `Result` (done, or run again after N seconds). It reads what MQTT told the controller (the
runtime) and the Device object (the cache), plans commands with the pure `devices.plan`, sends them
through the `Driver`, and writes status only if `status.to_write` says it changed.

A command for a target that an Interlock forbids is not sent, whoever set the target (a person's `kubectl
apply` above all: an executing Intent's own command was judged right before it, and goes out). The target is
held, on record in status (`interlockedTargets`, condition Interlocked), and stays held once the rule holds
again: only a changed target is driven (or an Intent that the interlocks allow).

After a failsafe (the firmware moved an actuator to its contract's failsafe value when it lost the
controller's heartbeat) the target is driven again like any drift, through the same interlock and lease
checks, with a new command epoch. A target set longer ago than `redrive_max_age_s` (by the Device's
managedFields) is left at the failsafe value instead: condition Failsafe (TargetTooOld) and an Event say so,
until a person sets it anew. After a restart, targets that status shows reached at this generation and epoch
count as reached, so a device found elsewhere is drift, driven with a new command id: the old id would only
fetch the firmware's stored ack.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from corral.api.device import DeviceStatus, GuardingInterlock, InterlockedTarget
from corral.contract.values import same_value
from corral.decide.decision import Lease
from corral.devices.commands import CommandTimeout
from corral.devices.heartbeat import failsafes_too_soon, too_soon_note
from corral.devices.plan import Command, Plan, plan
from corral.kube.cache import Body, key_of
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.kube.workqueue import Result
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.driver import Driver, Pin, Superseded
from corral.reconcile.devices.notices import DeviceNotices, as_json
from corral.reconcile.devices.runtime import DeviceRuntime, Fleet
from corral.reconcile.devices.status import (
    Observed,
    device_status,
    duplicate_status,
    parse,
    remember_write,
    sensor_readings,
    sensors_due,
    serialize,
    sync_verdict,
    to_write,
    waiting_status,
)
from corral.reconcile.devices.targets import target_set_at
from corral.reconcile.devices.trust import ContractTrust

if TYPE_CHECKING:
    from corral.reconcile.guards.interlocks import Interlocks, ViewOf

log = logging.getLogger(__name__)

# Retained `info` messages arrive right after subscribing; a Device is judged unheard of only after this.
RETAINED_GRACE_S = 3.0


@dataclass(frozen=True)
class Listening:
    """The MQTT link as the reconcilers need to know it."""

    connected: Callable[[], bool]
    up_since: Callable[[], float]

    def still_listening(self) -> bool:
        """True right after (re)connecting, while retained messages may still tell of devices."""
        return not self.connected() or time.monotonic() - self.up_since() < RETAINED_GRACE_S


class DeviceReconciler:
    def __init__(self, config: ControllerConfig, kube: Kube, fleet: Fleet, devices: DeviceCache, driver: Driver,
                 notices: DeviceNotices, recorder: EventRecorder, listening: Listening, trust: ContractTrust,
                 interlocks: Interlocks | None = None, view_of: ViewOf | None = None,
                 leased: Callable[[str, str], Lease | None] | None = None) -> None:
        self.config = config
        self.trust = trust
        self.interlocks = interlocks
        self.view_of = view_of  # the port's view of a Device, what interlock conditions are judged over
        self.leased = leased  # the Device's lease now, if any: while it lasts only its holder's Intents are driven
        self.kube = kube
        self.fleet = fleet
        self.devices = devices
        self.driver = driver
        self.notices = notices
        self.recorder = recorder
        self.listening = listening
        self._announced_duplicates: set[str] = set()

    async def reconcile(self, device_id: str) -> Result:
        rt = self.fleet.get(device_id)
        bound = self.devices.bound(device_id)
        if not bound:
            return Result.done()  # the controller drives enrolled devices only: a person makes their Device
        body = bound[0]
        for duplicate in bound[1:]:
            await self._refuse_duplicate(duplicate, body)
        if rt is None:
            if self.listening.still_listening():
                wait = RETAINED_GRACE_S - (time.monotonic() - self.listening.up_since())
                return Result.after(wait if self.listening.connected() else RETAINED_GRACE_S)
            await self._write(None, body, waiting_status(parse(body.get("status")), _generation(body), _now()),
                              "waiting")
            return Result.done()
        if rt.contract is None:
            if rt.contract_error is not None:
                self.notices.once(rt, body, "contract-refused", "ContractRefused", "Refuse",
                                  f"The device's contract was refused: {rt.contract_error}", "Warning",
                                  fact=("contract.refused", {"why": rt.contract_error}))
            await self._write(rt, body, self._status(rt, body, None), "contract")
            return Result.done()
        if not await self._trusted(rt, body):
            return Result.done()
        if not rt.reported and not rt.state_known:
            # After a restart, what status recorded is the baseline that changes are audited against.
            rt.reported = dict((body.get("status") or {}).get("reported") or {})
            self._seed_reached(rt, body)
        retry = Result.done()
        if rt.online and not rt.state_known and self.listening.connected():
            try:
                state = await self.driver.get_state(device_id)
            except CommandTimeout:
                retry = Result.after(self.config.backoff_min_s * 2)  # meanwhile status says what is known
            else:
                changed = rt.report(state)
                self.notices.state_changed(rt, changed, "state read after the device came online", body)
        return (await self._drive_to_target(rt, body)).sooner(retry)

    async def _drive_to_target(self, rt: DeviceRuntime, body: Body) -> Result:
        device_id = rt.device_id
        pins = self.driver.expectations.applied(device_id, _generation(body) or 0)
        result = self._plan(rt, body, pins)
        if result.held:
            # An Intent's target is on the way; its apply queues this device again. Until then the status
            # would tell a moment that never was (the target changed, the command not yet planned).
            return Result.done()
        self._announce_plan(rt, body, result)
        self._announce_failsafes(rt, body)
        if result.bump_epoch:
            # The new epoch must be on record before a command carries it (see devices.plan).
            rt.command_epoch = self._epoch(rt, body) + 1
            await self._write(rt, body, self._status(rt, body, result), "epoch")
            return Result.after(0)
        result, interlocked = self._interlocked(rt, body, result, pins)
        result, lease_held = self._lease_held(body, result, pins)
        outcome = Result.done()
        if result.commands:
            if not rt.online:
                pass  # sent when the device is back online (its status message queues it)
            elif time.monotonic() < rt.next_attempt:
                outcome = Result.after(rt.next_attempt - time.monotonic())
            else:
                outcome = await self._drive(rt, body, result.commands, {p.command_id: p for p in pins})
                body = self.devices.get(key_of(body)) or body
                pins = self.driver.expectations.applied(device_id, _generation(body) or 0)
                result, interlocked = self._interlocked(rt, body, self._plan(rt, body, pins), pins)
                result, lease_held = self._lease_held(body, result, pins)
        await self._write(rt, body, self._status(rt, body, result, interlocked, lease_held), "reconcile")
        return outcome

    def _lease_held(self, body: Body, result: Plan, pins: list[Pin]) -> tuple[Plan, str | None]:
        """While the Device is leased, targets set by anyone but the holder's Intents (a person's kubectl apply) are
        not driven; they are once the lease ends. What is held, as the condition Leased says it."""
        lease = self.leased(body["metadata"]["namespace"], body["metadata"]["name"]) if self.leased else None
        if lease is None or lease.expires_at <= datetime.now(UTC) or not result.commands:
            return result, None
        pinned = {p.command_id for p in pins}  # the holder's Intents: the lease was judged right before them
        held = [c for c in result.commands if c.id not in pinned]
        if not held:
            return result, None
        shown = ", ".join(f"spec.target.{c.actuator}={as_json(c.value)}" for c in held)
        message = (f"Not driving {shown}: Device {body['metadata']['name']} is leased to {lease.who()}"
                   + (f" ({lease.reason})" if lease.reason else "")
                   + f" until {lease.expires_at:%H:%M:%S} UTC unless renewed; it is driven when the lease ends "
                     "(or a person breaks it: corral lease break).")
        return dataclasses.replace(result, commands=[c for c in result.commands if c.id in pinned]), message

    def _interlocked(self, rt: DeviceRuntime, body: Body, result: Plan, pins: list[Pin]
                     ) -> tuple[Plan, tuple[InterlockedTarget, ...]]:
        """The plan without the commands an interlock forbids (or forbade, for the same target), and those held."""
        if self.interlocks is None or self.view_of is None or not result.commands:
            return result, ()
        previous = parse(body.get("status"))
        held_before = {h.actuator: h for h in (previous.interlocked_targets or [])} if previous is not None else {}
        pinned = {p.command_id for p in pins}  # an executing Intent's: the interlocks judged it right before
        namespace, generation = body["metadata"]["namespace"], _generation(body)
        keep: list[Command] = []
        held: list[InterlockedTarget] = []
        for command in result.commands:
            before = held_before.get(command.actuator)
            if command.id in pinned:
                keep.append(command)
            elif before is not None and same_value(before.value, command.value):
                held.append(before)  # forbidden when it was set: not driven by itself, whatever the rule says now
            elif forbidding := [v for v in self.interlocks.verdicts(namespace, body, command.actuator, command.value,
                                                                    self.view_of) if not v.holds]:
                first = forbidding[0]
                target = InterlockedTarget(actuator=command.actuator, value=command.value, interlock=first.name,
                                           message=first.message[:1024])
                held.append(target)
                shown = f"spec.target.{command.actuator}={as_json(command.value)}"
                self.notices.once(
                    rt, body, f"interlocked/{generation}/{command.actuator}/{as_json(command.value)}", "Interlocked",
                    "Hold", f"Not driving {shown}: Interlock {first.name} forbids it: {first.message}. It stays held "
                            "until the target changes, even once the rule holds again.", "Warning",
                    fact=("target.interlocked", {"actuator": command.actuator, "value": command.value,
                                                 "interlock": first.name, "message": first.message,
                                                 "generation": generation}))
            else:
                keep.append(command)
        if not held:
            return result, ()
        return dataclasses.replace(result, commands=keep), tuple(held)

    def _plan(self, rt: DeviceRuntime, body: Body, pins: list[Pin]) -> Plan:
        if rt.contract is None:
            # Refused (ingest) while a command was out: nothing more is planned on it, and the status written
            # next says why (condition ContractValid), instead of the reconcile failing.
            return Plan()
        spec = body.get("spec") or {}
        generation, uid = _generation(body) or 1, body["metadata"]["uid"]
        epoch = self._epoch(rt, body)
        reached = rt.reached_set((uid, generation, epoch))
        result = plan(rt.contract, spec.get("target") or {}, rt.reported, uid=uid, generation=generation, epoch=epoch,
                      drift=spec.get("drift", "Enforce"), reached=frozenset(reached), pinned=[p.command for p in pins],
                      held=self.driver.expectations.held(rt.device_id, generation),
                      leave=frozenset(self._too_old(rt, body)))
        for gone in result.superseded:
            for pin in pins:
                if pin.command_id == gone.id:
                    target = (spec.get("target") or {}).get(gone.actuator)
                    self.driver.expectations.fail(pin, Superseded(
                        f"spec.target.{gone.actuator} of Device {body['metadata']['name']} changed to "
                        f"{as_json(target)} before the command for {as_json(gone.value)} went out"))
        return result

    def _announce_plan(self, rt: DeviceRuntime, body: Body, result: Plan) -> None:
        generation = _generation(body)
        for actuator, why in result.invalid.items():
            self.notices.once(rt, body, f"invalid/{generation}/{actuator}", "TargetInvalid", "Refuse",
                              f"Not sent to the device: {why}", "Warning")
        if result.drifted:
            epoch = self._epoch(rt, body)
            self.notices.once(
                rt, body, f"drift/{generation}/{epoch}/{','.join(result.drifted)}", "Drift", "Observe",
                f"The device left its target for {', '.join(result.drifted)} (reported "
                f"{as_json({a: rt.reported.get(a) for a in result.drifted})}); "
                + ("re-driving it." if result.bump_epoch else "drift: Observe, leaving it alone."),
                "Warning",
            )

    async def _drive(self, rt: DeviceRuntime, body: Body, commands: list[Command], pins: dict[str, Pin]) -> Result:
        """Send the commands one by one, each waiting for its ack; stop at the first that fails."""
        generation, uid = _generation(body) or 1, body["metadata"]["uid"]
        reached = rt.reached_set((uid, generation, self._epoch(rt, body)))
        for command in commands:
            pin = pins.get(command.id)
            cause = f"intent {pin.intent}" if pin is not None else _cause(body)
            sent = {"commandId": command.id, "action": command.action, "actuator": command.actuator,
                    "value": command.value}
            self.notices.fact("command.sent", body, {**sent, "cause": cause, "before": dict(rt.reported)})
            if pin is None:
                # A command an Intent asked for is told by the Intent's outcome Event.
                self.notices.post(body, "CommandSent", "Command",
                                  f"{command.action} {command.actuator}={as_json(command.value)} (command {command.id}; "
                                  f"cause: {cause}); before: {as_json(rt.reported)}")
            try:
                ack = await self.driver.send(rt.device_id, command, pin.trace if pin is not None else None)
            except CommandTimeout as err:
                delay = self._backoff(rt)
                self.notices.fact("command.timeout", body, {**sent, "retryInS": round(delay, 3)})
                self.notices.post(body, "CommandTimeout", "Command",
                                  f"{err}; will resend the same command id in {delay:.0f}s", "Warning")
                return Result.after(delay)
            self.notices.fact("ack.received", body, {
                "commandId": ack.id, "ok": ack.ok, "error": ack.error, "state": dict(ack.state),
                "clamped": ack.clamped.model_dump(mode="json") if ack.clamped is not None else None})
            if not ack.ok:
                delay = self._backoff(rt)
                self.notices.post(body, "CommandFailed", "Command",
                                  f"The device refused command {command.id}: {ack.error}", "Warning")
                if ack.state:
                    self.notices.state_changed(rt, rt.report(dict(ack.state)), f"command {command.id}", body)
                return Result.after(delay)
            rt.failures, rt.next_attempt = 0, 0.0
            changed = rt.report(dict(ack.state))
            # On the Device too when an Intent asked: `kubectl describe device` shows only Events regarding it (the
            # Intent's outcome Event names the Device as `related`, which describe does not read).
            self.notices.state_changed(rt, changed, f"command {command.id} ({cause})", body)
            if ack.clamped is not None:
                self.notices.post(body, "ValueClamped", "Command",
                                  f"The device clamped {ack.clamped.actuator}: requested {ack.clamped.requested!r}, "
                                  f"applied {ack.clamped.applied!r} (command {command.id})", "Warning")
            reached.add(command.actuator)
        return Result.done()

    # ---- after a failsafe -----------------------------------------------------------------------------------

    def _seed_reached(self, rt: DeviceRuntime, body: Body) -> None:
        """A fresh runtime (a restart): the targets status shows reached at this generation and epoch were
        driven (or needed nothing), so a difference the device reports now is drift, not a pending change."""
        status = body.get("status") or {}
        generation = _generation(body) or 1
        if status.get("observedGeneration") != generation:
            return
        reached = rt.reached_set((body["metadata"]["uid"], generation, self._epoch(rt, body)))
        recorded = status.get("reported") or {}
        for actuator, wanted in ((body.get("spec") or {}).get("target") or {}).items():
            if actuator in recorded and same_value(recorded[actuator], wanted):
                reached.add(actuator)

    def _too_old(self, rt: DeviceRuntime, body: Body) -> dict[str, float]:
        """Actuators at their failsafe value whose target was set longer ago than the re-drive age: id -> age in s.
        A target of unknown age (no managedFields entry owns it) is driven again."""
        target = (body.get("spec") or {}).get("target") or {}
        old: dict[str, float] = {}
        for actuator, report in rt.failsafe.items():
            set_at = target_set_at(body, actuator) if actuator in target and report.error is None else None
            if set_at is not None:
                age = (datetime.now(UTC) - set_at).total_seconds()
                if age > self.config.redrive_max_age_s:
                    old[actuator] = age
        return old

    def _announce_failsafes(self, rt: DeviceRuntime, body: Body) -> None:
        target = (body.get("spec") or {}).get("target") or {}
        too_old = self._too_old(rt, body)
        for actuator, report in sorted(rt.failsafe.items()):
            key = f"{actuator}/{report.ts}"
            self.notices.once(rt, body, f"failsafe/{key}", "Failsafe", "Observe",
                              f"The device moved {report.cause(actuator)}.", "Warning",
                              fact=("device.failsafe", {"actuator": actuator,
                                                        **report.model_dump(mode="json", exclude_none=True)}))
            if actuator in too_old:
                self.notices.once(rt, body, f"failsafe-too-old/{key}", "FailsafeTargetTooOld", "Hold",
                                  _too_old_note(actuator, target[actuator], too_old[actuator],
                                                self.config.redrive_max_age_s), "Warning",
                                  fact=("target.not_redriven", {"actuator": actuator, "value": target[actuator],
                                                                "ageS": round(too_old[actuator], 1),
                                                                "maxAgeS": self.config.redrive_max_age_s}))

    def _failsafe_condition(self, rt: DeviceRuntime, body: Body) -> tuple[str, str] | None:
        """(reason, message) of condition Failsafe while an actuator sits at its failsafe value."""
        if not rt.failsafe:
            return None
        target = (body.get("spec") or {}).get("target") or {}
        too_old = self._too_old(rt, body)
        parts = []
        for actuator, report in sorted(rt.failsafe.items()):
            if actuator in too_old:
                then = _too_old_note(actuator, target[actuator], too_old[actuator], self.config.redrive_max_age_s)
            elif actuator in target:
                then = f"spec.target.{actuator}={as_json(target[actuator])} is driven again where the interlocks allow it."
            else:
                then = "it has no target to go back to."
            parts.append(f"The device moved {report.cause(actuator)}; {then}")
        return ("TargetTooOld" if too_old else "FailsafeApplied"), " ".join(parts)

    def _backoff(self, rt: DeviceRuntime) -> float:
        delay = min(self.config.backoff_max_s, self.config.backoff_min_s * 2.0 ** rt.failures)
        rt.failures += 1
        rt.next_attempt = time.monotonic() + delay
        return delay

    def _epoch(self, rt: DeviceRuntime, body: Body) -> int:
        """The re-drive epoch in effect: ours if we just raised it, else what status records."""
        recorded = int((body.get("status") or {}).get("commandEpoch") or 0)
        rt.command_epoch = max(rt.command_epoch, recorded)
        return rt.command_epoch

    # ---- status ---------------------------------------------------------------------------------------------

    def _status(self, rt: DeviceRuntime, body: Body, result: Plan | None,
                interlocked: tuple[InterlockedTarget, ...] | None = None, lease_held: str | None = None
                ) -> DeviceStatus:
        """interlocked: the targets held now; None (not judged this time): those on record stay held."""
        previous = parse(body.get("status"))
        if interlocked is None:
            interlocked = tuple(previous.interlocked_targets or ()) if previous is not None else ()
        sensors = {s.metric: s for s in rt.contract.sensors} if rt.contract else {}
        if sensors_due(rt.memory, rt.buffer.latest, sensors, self.config.coalescing, time.monotonic()):
            readings = sensor_readings(rt.buffer.latest, sensors)
        else:
            readings = dict(previous.sensors) if previous is not None else {}
        accepted = rt.contract is not None
        observed = Observed(
            generation=_generation(body),
            online=bool(rt.online),
            capability=rt.capability if accepted else None,
            accepted_capability=(rt.accepted_capability if rt.accepted_for == body["metadata"].get("uid")
                                 else previous.accepted_capability if previous is not None else None),
            hold=rt.hold if accepted else (),
            hold_reason=rt.hold_reason or "ChangeNeedsAcceptance",
            device=body["metadata"]["name"],
            contract_error=rt.contract_error,
            reported=rt.reported,
            sensors=readings,
            command_epoch=self._epoch(rt, body),
            verdict=sync_verdict(result, bool(rt.online), rt.failures) if accepted and result is not None else None,
            interlocks=self._guarding(body),
            interlocked=interlocked,
            failsafe=self._failsafe_condition(rt, body) if accepted else None,
            lease_held=lease_held,
        )
        return device_status(observed, previous, _now())

    def _guarding(self, body: Body) -> tuple[GuardingInterlock, ...]:
        if self.interlocks is None:
            return ()
        return tuple(GuardingInterlock(name=c.rule.name, actuators=list(c.rule.actuators), condition=c.rule.condition,
                                       message=c.rule.message, compiled=c.ok)
                     for c in self.interlocks.guarding(body["metadata"]["namespace"], body)[:32])

    async def _write(self, rt: DeviceRuntime | None, body: Body, status: DeviceStatus, reason: str) -> None:
        body = self.devices.get(key_of(body)) or body
        previous = parse(body.get("status"))
        now = time.monotonic()
        last_seen_due = rt is not None and now - rt.memory.last_seen_written_at >= self.config.last_seen_interval_s
        decided = to_write(status, previous, rt.last_seen if rt is not None else None, last_seen_due)
        if decided is None:
            return
        status, why = decided
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        log.debug("status write %s/%s (%s)", namespace, name, reason)
        written = await self.kube.apply_status("devices", namespace, name, "Device", serialize(status),
                                               "last-seen" if why == "last-seen" else reason)
        self.devices.upsert(written)  # a status-only change: nothing to reconcile for it
        if rt is not None:
            remember_write(rt.memory, status, previous, self.config.coalescing, now)

    # ---- the Kubernetes side --------------------------------------------------------------------------------

    async def _trusted(self, rt: DeviceRuntime, body: Body) -> bool:
        """Judge the announced contract against the accepted one; False when the device is held (or its contract
        refused) and nothing may be driven: its status says why."""
        assert rt.contract is not None and rt.capability is not None
        was_held = bool(rt.hold)
        refused = self.trust.judge(rt, body)
        if refused is not None:
            rt.contract, rt.contract_error = None, refused
            self.notices.once(rt, body, f"contract-refused/{rt.capability}", "ContractRefused", "Refuse",
                              f"The device's contract was refused: {refused}", "Warning",
                              fact=("contract.refused", {"capability": rt.capability, "why": refused}))
            await self._write(rt, body, self._status(rt, body, None), "contract")
            return False
        if not rt.hold:
            # Only an accepted contract gets a Capability (a held one is named in status.capability and waits);
            # made again if it was deleted while the Device trusts it.
            await self.trust.capabilities.ensure(rt.capability, rt.contract, rt.device_id)
        if not rt.capability_ensured and not rt.hold:
            rt.capability_ensured = True
            if f"contract/{rt.capability}" not in rt.announced:
                rt.announced.add(f"contract/{rt.capability}")  # once per controller run
                self.notices.fact("contract.in_force", body, {"capability": rt.capability,
                                                              "version": rt.contract.version})
            too_soon = failsafes_too_soon(rt.contract, self.config.heartbeat_interval_s)
            if too_soon:
                note = too_soon_note(too_soon, self.config.heartbeat_interval_s)
                log.warning("device %s: %s", rt.device_id, note)
                self.notices.once(rt, body, f"failsafe-too-soon/{rt.capability}", "FailsafeTooSoon", "Observe",
                                  note, "Warning")
        name = body["metadata"]["name"]
        if rt.hold:
            # One Event and record per accepted contract while held, not per announcement: a device re-announcing
            # changed contracts cannot flood them (each change is on record as contract.changed; the condition
            # always names the latest).
            self.notices.once(rt, body, f"hold/{rt.accepted_capability}", "ContractHeld", "Hold",
                              f"The device announced a contract (Capability {rt.capability}) that asks for more trust "
                              f"than the accepted one ({rt.accepted_capability}): {'; '.join(rt.hold)}. Nothing is "
                              f"sent to it and its Intents wait until a person accepts it (corral devices "
                              f"accept-contract {name}).", "Warning",
                              fact=("contract.held", {"capability": rt.capability, "accepted": rt.accepted_capability,
                                                      "why": list(rt.hold)}))
            await self._write(rt, body, self._status(rt, body, None), "hold")
            return False
        if was_held:
            self.notices.fact("contract.accepted", body, {"capability": rt.capability, "by": "spec.acceptCapability"})
            self.notices.post(body, "ContractAccepted", "Accept",
                              f"Capability {rt.capability} accepted (spec.acceptCapability); the device is driven again.")
        return True

    async def _refuse_duplicate(self, body: Body, winner: Body) -> None:
        owner = f"{winner['metadata']['namespace']}/{winner['metadata']['name']}"
        message = (f"device {body['spec']['deviceId']} is already bound to Device {owner} (the oldest claim wins); "
                   "this Device stays inert until that one is deleted or its deviceId changes")
        await self._write(None, body, duplicate_status(parse(body.get("status")), _generation(body), message, _now()),
                          "duplicate")
        key = f"duplicate/{body['metadata'].get('uid')}"
        if key not in self._announced_duplicates:
            self._announced_duplicates.add(key)
            self.notices.post(body, "DuplicateDeviceId", "Refuse", message, "Warning")


def _generation(body: Body) -> int | None:
    generation = body["metadata"].get("generation")
    return int(generation) if generation is not None else None


def _cause(body: Body) -> str:
    intent = (body["metadata"].get("annotations") or {}).get("corral.dev/intent")
    return f"intent {intent}" if intent else f"spec change (generation {_generation(body)})"


def _too_old_note(actuator: str, value: object, age_s: float, max_age_s: float) -> str:
    return (f"spec.target.{actuator}={as_json(value)} was set {_duration(age_s)} ago, longer than the re-drive age "
            f"({_duration(max_age_s)}, corral run --redrive-max-age): it is not driven again by itself. Set it anew "
            "to drive it: an Intent for it, or a change to spec.target.")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
