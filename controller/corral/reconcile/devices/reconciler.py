"""Reconciling one device: its Device, its contract mirrored as a Capability, plan, drive, write status.

`DeviceReconciler.reconcile(device_id)` is called by the work queue, one device at a time, and answers with a
`Result` (done, or run again after N seconds). It reads what MQTT told the controller (the runtime) and the
Device as a model (the cache), plans commands with the pure `devices.plan`, sends them through the `Driver`,
and writes status only if `status.to_write` says it changed. Which watch events queue a device id is declared
where the controller is wired (`wiring`), not here.

The parts it calls, each in its own module: `admission` (a trusted contract, one claim per device id, a
readable Device), `holds` (interlocks and leases that keep a command from going out), `failsafes` (what is
driven again after the firmware fell back to its failsafe values), `writes` (the status, built and written).

After a restart, targets that status shows reached at this generation and epoch count as reached, so a device
found elsewhere is drift, driven with a new command id: the old id would only fetch the firmware's stored ack.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from corral.api.codes import INTENT_ANNOTATION
from corral.api.device import Device, DeviceStatus, InterlockedTarget
from corral.decide.decision import Lease
from corral.devices.commands import CommandTimeout
from corral.devices.plan import Command, Plan, plan
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.kube.workqueue import Result
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.admission import Admission
from corral.reconcile.devices.cache import DeviceCache, key_of_device
from corral.reconcile.devices.driver import Driver, Pin, Superseded
from corral.reconcile.devices.failsafes import Failsafes
from corral.reconcile.devices.holds import TargetHolds
from corral.reconcile.devices.listening import Listening
from corral.reconcile.devices.notices import DeviceNotices, as_json
from corral.reconcile.devices.onlimits import OnTimeLimits
from corral.reconcile.devices.runtime import DeviceRuntime, Fleet
from corral.reconcile.devices.status import recorded, waiting_status
from corral.reconcile.devices.trust import ContractTrust
from corral.reconcile.devices.writes import StatusWriter, command_epoch, now
from corral.reconcile.locations import LocationLabels

if TYPE_CHECKING:
    from corral.reconcile.guards.interlocks import Interlocks, ViewOf

__all__ = ["DeviceReconciler", "Listening"]


class DeviceReconciler:
    def __init__(self, config: ControllerConfig, kube: Kube, fleet: Fleet, devices: DeviceCache, driver: Driver,
                 notices: DeviceNotices, recorder: EventRecorder, listening: Listening, trust: ContractTrust,
                 interlocks: Interlocks | None = None, view_of: ViewOf | None = None,
                 leased: Callable[[str, str], Lease | None] | None = None) -> None:
        self.config = config
        self.fleet = fleet
        self.devices = devices
        self.driver = driver
        self.notices = notices
        self.listening = listening
        self.failsafes = Failsafes(config, notices)
        self.holds = TargetHolds(notices, interlocks, view_of, leased)
        self.limits = OnTimeLimits(notices)
        self.writer = StatusWriter(config, kube, devices, self.failsafes, self.holds, self.limits)
        self.admission = Admission(config, kube, trust, notices, recorder, self.writer)
        self.locations = LocationLabels(kube)

    async def reconcile(self, device_id: str) -> Result:
        for refused in self.devices.refusals(device_id):
            await self.admission.refuse_malformed(refused)
        bound = self.devices.claims(device_id)
        if not bound:
            return Result.done()  # the controller drives enrolled devices only: a person makes their Device
        if await self._label_locations(bound):
            bound = self.devices.claims(device_id) or bound
        device = bound[0]
        for duplicate in bound[1:]:
            await self.admission.refuse_duplicate(duplicate, device)
        rt = self.fleet.get(device_id)
        if rt is None:
            if self.listening.still_listening():
                return Result.after(self.listening.grace_left())
            await self.writer.write(None, device, waiting_status(recorded(device), device.metadata.generation,
                                                                 now()), "waiting")
            return Result.done()
        if rt.contract is None:
            if rt.contract_error is not None:
                self.notices.once(rt, device, "contract-refused", "ContractRefused", "Refuse",
                                  f"The device's contract was refused: {rt.contract_error}", "Warning",
                                  fact=("contract.refused", {"why": rt.contract_error}))
            await self.writer.write(rt, device, self._status(rt, device, None), "contract")
            return Result.done()
        if not await self.admission.trusted(rt, device):
            return Result.done()
        if not rt.reported and not rt.state_known:
            # After a restart, what status recorded is the baseline that changes are audited against.
            rt.reported = dict(device.status.reported) if device.status is not None else {}
            self._seed_reached(rt, device)
        retry = Result.done()
        if rt.online and not rt.state_known and self.listening.connected():
            try:
                state = await self.driver.get_state(device_id)
            except CommandTimeout:
                retry = Result.after(self.config.backoff_min_s * 2)  # meanwhile status says what is known
            else:
                changed = rt.report(state)
                self.notices.state_changed(rt, changed, "state read after the device came online", device)
        return (await self._drive_to_target(rt, device)).sooner(retry)

    async def _label_locations(self, bound: list[Device]) -> bool:
        """Every Device claiming the id carries the location label its overlay says, whoever set the overlay (and
        before anything else: an offline or untrusted device is still selected by where it is). Whether one was
        written (the cache has it then)."""
        written = False
        for device in bound:
            answer = await self.locations.sync_device(device)
            if answer is not None:
                self.devices.upsert(answer)  # only metadata changed: nothing to reconcile for it
                written = True
        return written

    async def _drive_to_target(self, rt: DeviceRuntime, device: Device) -> Result:
        device_id = rt.device_id
        pins = self.driver.expectations.applied(device_id, device.metadata.generation or 0)
        result = self._plan(rt, device, pins)
        if result.held:
            # An Intent's target is on the way; its apply queues this device again. Until then the status
            # would tell a moment that never was (the target changed, the command not yet planned).
            return Result.done()
        self._announce_plan(rt, device, result)
        self.failsafes.announce(rt, device)
        self.limits.announce(rt, device)
        if result.bump_epoch:
            # The new epoch must be on record before a command carries it (see devices.plan).
            rt.command_epoch = command_epoch(rt, device) + 1
            await self.writer.write(rt, device, self._status(rt, device, result), "epoch")
            return Result.after(0)
        result, interlocked = self._interlocked(rt, device, result, pins)
        result, lease_held = self.holds.lease_held(device, result, pins)
        outcome = Result.done()
        if result.commands:
            if not rt.online:
                pass  # sent when the device is back online (its status message queues it)
            elif time.monotonic() < rt.next_attempt:
                outcome = Result.after(rt.next_attempt - time.monotonic())
            else:
                outcome = await self._drive(rt, device, result.commands, {p.command_id: p for p in pins})
                if any(p.future.done() and self.driver.expectations.holds(p) for p in pins):
                    # An Intent's command was answered: its final status write goes first. Ending, it releases
                    # its pin, which queues this device again, and that reconcile writes the state it reached.
                    return outcome
                device = self.devices.device(key_of_device(device)) or device
                pins = self.driver.expectations.applied(device_id, device.metadata.generation or 0)
                result, interlocked = self._interlocked(rt, device, self._plan(rt, device, pins), pins)
                result, lease_held = self.holds.lease_held(device, result, pins)
        await self.writer.write(rt, device, self._status(rt, device, result, interlocked, lease_held), "reconcile")
        return outcome

    def _plan(self, rt: DeviceRuntime, device: Device, pins: list[Pin]) -> Plan:
        if rt.contract is None:
            # Refused (ingest) while a command was out: nothing more is planned on it, and the status written
            # next says why (condition ContractValid), instead of the reconcile failing.
            return Plan()
        target = device.spec.target
        generation, uid = device.metadata.generation or 1, device.metadata.uid or ""
        epoch = command_epoch(rt, device)
        reached = rt.reached_set((uid, generation, epoch))
        result = plan(rt.contract, dict[str, object](target), rt.reported, uid=uid, generation=generation, epoch=epoch,
                      drift=device.spec.drift, reached=frozenset(reached), pinned=[p.command for p in pins],
                      held=self.driver.expectations.held(rt.device_id, generation),
                      leave=frozenset(self.failsafes.too_old(rt, device)), limited=self.limits.limited(rt, device))
        for gone in result.superseded:
            for pin in pins:
                if pin.command_id == gone.id:
                    self.driver.expectations.fail(pin, Superseded(
                        f"spec.target.{gone.actuator} of Device {device.metadata.name} changed to "
                        f"{as_json(target.get(gone.actuator))} before the command for {as_json(gone.value)} went out"))
        return result

    def _announce_plan(self, rt: DeviceRuntime, device: Device, result: Plan) -> None:
        generation = device.metadata.generation
        for actuator, why in result.invalid.items():
            self.notices.once(rt, device, f"invalid/{generation}/{actuator}", "TargetInvalid", "Refuse",
                              f"Not sent to the device: {why}", "Warning")
        if result.drifted:
            epoch = command_epoch(rt, device)
            self.notices.once(
                rt, device, f"drift/{generation}/{epoch}/{','.join(result.drifted)}", "Drift", "Observe",
                f"The device left its target for {', '.join(result.drifted)} (reported "
                f"{as_json({a: rt.reported.get(a) for a in result.drifted})}); "
                + ("re-driving it." if result.bump_epoch else "drift: Observe, leaving it alone."),
                "Warning",
            )

    async def _drive(self, rt: DeviceRuntime, device: Device, commands: list[Command], pins: dict[str, Pin]) -> Result:
        """Send the commands one by one, each waiting for its ack; stop at the first that fails."""
        generation, uid = device.metadata.generation or 1, device.metadata.uid or ""
        reached = rt.reached_set((uid, generation, command_epoch(rt, device)))
        for command in commands:
            pin = pins.get(command.id)
            cause = f"intent {pin.intent}" if pin is not None else _cause(device)
            sent = {"commandId": command.id, "action": command.action, "actuator": command.actuator,
                    "value": command.value}
            self.notices.fact("command.sent", device, {**sent, "cause": cause, "before": dict(rt.reported)})
            if pin is None:
                # A command an Intent asked for is told by the Intent's outcome Event.
                self.notices.post(device, "CommandSent", "Command",
                                  f"{command.action} {command.actuator}={as_json(command.value)} (command {command.id}; "
                                  f"cause: {cause}); before: {as_json(rt.reported)}")
            try:
                ack = await self.driver.send(rt.device_id, command, pin.trace if pin is not None else None,
                                             pinned=pin is not None)
            except CommandTimeout as err:
                delay = self._backoff(rt)
                self.notices.fact("command.timeout", device, {**sent, "retryInS": round(delay, 3)})
                self.notices.post(device, "CommandTimeout", "Command",
                                  f"{err}; will resend the same command id in {delay:.0f}s", "Warning")
                return Result.after(delay)
            self.notices.fact("ack.received", device, {
                "commandId": ack.id, "ok": ack.ok, "error": ack.error, "state": dict(ack.state),
                "clamped": ack.clamped.model_dump(mode="json") if ack.clamped is not None else None})
            if not ack.ok:
                delay = self._backoff(rt)
                self.notices.post(device, "CommandFailed", "Command",
                                  f"The device refused command {command.id}: {ack.error}", "Warning")
                if ack.state:
                    self.notices.state_changed(rt, rt.report(dict(ack.state)), f"command {command.id}", device)
                return Result.after(delay)
            rt.failures, rt.next_attempt = 0, 0.0
            changed = rt.report(dict(ack.state))
            # On the Device too when an Intent asked: `kubectl describe device` shows only Events regarding it (the
            # Intent's outcome Event names the Device as `related`, which describe does not read).
            self.notices.state_changed(rt, changed, f"command {command.id} ({cause})", device)
            if ack.clamped is not None:
                self.notices.post(device, "ValueClamped", "Command",
                                  f"The device clamped {ack.clamped.actuator}: requested {ack.clamped.requested!r}, "
                                  f"applied {ack.clamped.applied!r} (command {command.id})", "Warning")
            reached.add(command.actuator)
        return Result.done()

    def _backoff(self, rt: DeviceRuntime) -> float:
        delay = min(self.config.backoff_max_s, self.config.backoff_min_s * 2.0 ** rt.failures)
        rt.failures += 1
        rt.next_attempt = time.monotonic() + delay
        return delay

    # ---- the parts' answers, by the names the reconciler (and its unit tests) know them -----------------------

    def _status(self, rt: DeviceRuntime, device: Device, result: Plan | None,
                interlocked: tuple[InterlockedTarget, ...] | None = None, lease_held: str | None = None
                ) -> DeviceStatus:
        return self.writer.status(rt, device, result, interlocked, lease_held)

    def _interlocked(self, rt: DeviceRuntime, device: Device, result: Plan, pins: list[Pin]
                     ) -> tuple[Plan, tuple[InterlockedTarget, ...]]:
        return self.holds.interlocked(rt, device, result, pins)

    def _seed_reached(self, rt: DeviceRuntime, device: Device) -> None:
        self.failsafes.seed_reached(rt, device, command_epoch(rt, device))

    def _too_old(self, rt: DeviceRuntime, device: Device) -> dict[str, float]:
        return self.failsafes.too_old(rt, device)

    def _failsafe_condition(self, rt: DeviceRuntime, device: Device) -> tuple[str, str] | None:
        return self.failsafes.condition(rt, device)


def _cause(device: Device) -> str:
    intent = (device.metadata.annotations or {}).get(INTENT_ANNOTATION)
    return f"intent {intent}" if intent else f"spec change (generation {device.metadata.generation})"
