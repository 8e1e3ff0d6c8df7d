"""Execution: the second reconciler of the Intent controller, one key per Device, so one Device's Intents never race.

The decision hands an actuating Intent over (`hand_over`); `ExecutionReconciler.reconcile(device_key)` then
executes the Intents ready for that Device one after another. Right before anything runs it checks scope,
pause, hold, interlocks and the lease again, then puts the execution on record in the audit log
(`intent.executing`, fsynced, with the command id and the state before), and only then pins the command and
applies the target. A controller restarted at any point resumes an Intent the log says is executing with the
same command id; it never decides it twice.

The `Executing` status is for people and clients watching a slow device, not for crash safety (the record is),
so it is written only when the execution outlasts `EXECUTING_STATUS_DELAY_S`: a device that acks at once costs
one status write, the final one. The final write never lands before a late `Executing` write: it cancels one
that has not started, and waits for one in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context

from corral.api.codes import FINAL_PHASES, DecisionCode
from corral.api.intent import IntentStatus
from corral.audit.decisions import EXECUTING
from corral.audit.log import AuditLog, Unwritable
from corral.contract.values import shown
from corral.decide.decision import Decision
from corral.kube.cache import Key, TypedCache
from corral.kube.objects import FieldConflict
from corral.kube.workqueue import Result, WorkQueue
from corral.obs import tracing
from corral.obs.crashpoints import EXECUTING_RECORDED, crash_point
from corral.reconcile.devices.driver import DeviceGone, DeviceRefused, Superseded
from corral.reconcile.devices.port import DevicePort, DeviceView
from corral.reconcile.doors import NotOwned
from corral.reconcile.intents.effects import Effects
from corral.reconcile.intents.facts import (
    StoredIntent,
    checked_value,
    name_of,
    namespace_of,
    status_of,
    trace_source,
    uid_of,
)
from corral.reconcile.intents.gather import Gatherer
from corral.reconcile.intents.holds import HoldReverts, held, pending, wire_hold
from corral.reconcile.intents.outcomes import Outcomes
from corral.reconcile.intents.settings import AUDIT_RECHECK_S, MESSAGE_LIMIT, IntentSettings

log = logging.getLogger(__name__)

# An execution that takes longer than this (a slow or silent device) shows `Executing` in its status; one that
# ends sooner goes from Pending to its final phase in one write. Short against a person's patience and the
# tests that wait for Executing, long against an ack (about 1 ms) plus the final record and write (~10 ms).
EXECUTING_STATUS_DELAY_S = 0.5


@dataclass(frozen=True)
class Ready:
    """An Intent handed to execution: what the decision established (None when resumed after a restart)."""

    key: Key
    decision: Decision | None
    revert: bool = False  # a final Intent whose timed hold ran out: its revert (holds.py), not its execution


@dataclass(eq=False)
class LaterWrite:
    """An `Executing` status write waiting for its delay; `started` once its request may be on the wire."""

    task: asyncio.Task[None] | None = None
    started: bool = False


def new_command_id(intent_uid: str) -> str:
    """The Intent's command id, the same in every replica and after every restart: a new owner that resends it
    (its predecessor died between the send and the status) gets the firmware's stored ack (AckCache), so the
    hardware acts once. From the uid, not the name: a later Intent of the same name is another command. Short
    enough for the firmware's dedup memory; not guessable without reading the Intent."""
    return "i-" + hashlib.sha256(intent_uid.encode()).hexdigest()[:24]


class Handovers:
    """The Intents handed over to execution, by Device, in order; the execution queue holds their Devices."""

    def __init__(self) -> None:
        self.queue: WorkQueue[Key] = WorkQueue("executions")  # keys are (namespace, device name)
        self.ready: dict[Key, list[Ready]] = {}

    def hand_over(self, key: Key, intent: StoredIntent, decision: Decision | None, revert: bool = False) -> None:
        device_key = (key[0], intent.spec.device)
        ready = self.ready.setdefault(device_key, [])
        if all(r.key != key for r in ready):
            ready.append(Ready(key, decision, revert))
        self.queue.add(device_key)

    def handed_over(self, key: Key, intent: StoredIntent) -> bool:
        return any(r.key == key for r in self.ready.get((key[0], intent.spec.device), []))


class ExecutionReconciler:
    """Executes the Intents handed over for each Device, in the order they were handed over."""

    def __init__(self, settings: IntentSettings, handovers: Handovers, intents: TypedCache[StoredIntent],
                 devices: DevicePort, outcomes: Outcomes, gatherer: Gatherer, effects: Effects, audit: AuditLog,
                 decisions: WorkQueue[Key], reverts: HoldReverts) -> None:
        self.settings = settings
        self.handovers = handovers
        self.intents = intents
        self.devices = devices
        self.outcomes = outcomes
        self.gatherer = gatherer
        self.effects = effects
        self.audit = audit
        self.decisions = decisions  # the Intent queue: an executed Intent is reconciled again there
        self.reverts = reverts  # timed holds that ran out: put back on this queue, so they never race an Intent
        self._later: dict[str, LaterWrite] = {}  # the Executing writes not yet settled, by Intent uid

    async def reconcile(self, device_key: Key) -> Result:
        """Execute the next Intent ready for this Device; the queue runs one per Device at a time."""
        ready = self.handovers.ready.get(device_key, [])
        while ready:
            item = ready[0]
            intent = self.intents.get(item.key)
            if intent is not None and (pending(intent) if item.revert else status_of(intent).phase not in FINAL_PHASES):
                try:
                    await self._run(item, intent)
                finally:
                    ready.pop(0)
                break
            ready.pop(0)
        if not ready:
            self.handovers.ready.pop(device_key, None)
            return Result.done()
        return Result.after(0)

    async def _run(self, item: Ready, intent: StoredIntent) -> None:
        with tracing.tracer().start_as_current_span(
                "corral.intent.execute", context=tracing.context_of(self.outcomes.traces.of(trace_source(intent))),
                attributes={"corral.intent": name_of(intent)}):
            try:
                await (self.reverts.revert(intent) if item.revert else self._execute(intent, item.decision))
            except Unwritable:
                self.decisions.add_after(item.key, AUDIT_RECHECK_S)  # it waits, and says why
            except NotOwned as refused:
                # Its device's shard went to another replica mid-way: that one takes the Intent up (same command id).
                log.info("Intent %s left to its device's new owner: %s", name_of(intent), refused)
            except Exception:
                # Decided again from what is on record (Pending, or Executing: then resumed).
                delay = self.decisions.add_rate_limited(item.key)
                log.exception("executing Intent %s failed; deciding it again in %.2f s", name_of(intent), delay)
            else:
                self.decisions.add(item.key)  # it is final now: its housekeeping is the Intent's own
            finally:
                # None outlives its execution: one that failed is resumed from the record, which writes Executing.
                await self._settle_executing(uid_of(intent))

    async def _execute(self, intent: StoredIntent, decision: Decision | None) -> None:
        spec, status = intent.spec, status_of(intent)
        view = self.devices.view(namespace_of(intent), spec.device)
        value = checked_value(view, intent)
        if view is None or not view.exists or view.contract is None or value is None or view.device_id is None:
            if view is not None and view.device_id and status.command_id:
                self.devices.release_command(view.device_id, status.command_id)  # primed at start
            await self._finish(intent, view, "DEVICE_GONE", f"Device {spec.device} disappeared, or its "
                               "contract changed, before execution; nothing was sent.", {})
            return
        if decision is None:  # resumed after a restart: carried on with its own command id
            await self._drive(intent, view, value, status.command_id or new_command_id(uid_of(intent)), None)
            return
        started = await self._start(intent, view, value, decision)
        if started is not None:
            await self._drive(started[0], view, value, started[1], decision)

    async def _start(self, intent: StoredIntent, view: DeviceView, value: Any,
                     decision: Decision) -> tuple[StoredIntent, str] | None:
        """Checked once more, then Executing on record and in status, with a new command id; None when the check
        refused it."""
        denial = await self.gatherer.recheck(intent, view)
        if denial is not None:
            assert denial.code is not None
            await self._finish(intent, view, denial.code, denial.message, {})
            return None
        namespace, command_id = namespace_of(intent), new_command_id(uid_of(intent))
        # On record first: from here on a restart resumes this execution (with this command id).
        executing = {"phase": "Executing", "message": decision.message[:MESSAGE_LIMIT], "before": dict(view.reported),
                     "approval": ",".join(decision.approvals) or None, "grant": decision.grant,
                     "command_id": command_id}
        await self.outcomes.record(EXECUTING, intent, {
            "message": decision.message, "before": executing["before"], "approval": executing["approval"],
            "grant": decision.grant, "commandId": command_id, "value": value,
            "approvers": self.outcomes.approvers(namespace, decision.approvals)})
        crash_point(EXECUTING_RECORDED)
        for approval in decision.approvals:
            self.audit.note("approval.accepted", f"{namespace}/{approval}",
                            {"intent": name_of(intent), "intentUid": uid_of(intent)})
        self._write_executing_later(intent, executing)
        # The status as it is about to be, for the final write to merge into (before, approval, command id).
        staged = intent.model_copy(update={"status": IntentStatus.model_validate(
            {**status_of(intent).model_dump(by_alias=False), **executing})})
        self.outcomes.track((namespace, intent.metadata.name or ""), staged)
        return staged, command_id

    def _write_executing_later(self, intent: StoredIntent, executing: dict[str, Any]) -> None:
        later = LaterWrite()

        async def write() -> None:
            await asyncio.sleep(EXECUTING_STATUS_DELAY_S)
            later.started = True
            try:
                await self.outcomes.write(intent, executing, "executing")
            except Exception as err:  # noqa: BLE001 - the audit record, not this status, is what a restart reads
                log.warning("Intent %s: its Executing status could not be written (%s); the audit log holds its "
                            "execution, and its final status comes all the same", name_of(intent), err)

        later.task = asyncio.create_task(write(), name=f"executing-status {name_of(intent)}")
        self._later[uid_of(intent)] = later

    async def _settle_executing(self, uid: str) -> None:
        """Before any other status write of this Intent: a pending Executing write is dropped, one in flight is
        waited for, so that it can never land after (and undo) the final status."""
        later = self._later.pop(uid, None)
        if later is None or later.task is None:
            return
        if not later.started:
            later.task.cancel()
            return
        await asyncio.wait([later.task])

    async def _finish(self, intent: StoredIntent, view: DeviceView | None, code: DecisionCode, message: str,
                      extra: dict[str, Any], noted: dict[str, Any] | None = None) -> None:
        await self._settle_executing(uid_of(intent))
        if noted is None:
            await self.outcomes.finish(intent, view, code, message, extra)
        else:
            await self.outcomes.finish(intent, view, code, message, extra, noted)

    async def _drive(self, intent: StoredIntent, view: DeviceView, value: Any, command_id: str,
                     decision: Decision | None) -> None:
        """Pin the command, apply the target, and wait for the device's answer."""
        assert view.device_id is not None
        spec = intent.spec
        pin = self.devices.pin(view.device_id, spec.actuator, value, command_id, name_of(intent),
                               otel_context.get_current())
        try:
            consumed = asyncio.gather(*(self.effects.consume(intent, name)
                                        for name in (decision.approvals if decision else ())))
            try:
                await self.devices.apply_target(pin, view.body, intent.metadata.name or "")
            finally:
                await consumed
            await self._await_device(intent, view, pin.future, value, decision is None, command_id)
        except FieldConflict as conflict:
            await self._finish(
                intent, view, "FAILED",
                f"Not applied: spec.target.{spec.actuator} of Device {spec.device} is managed by someone else "
                f"({conflict}). Corral does not overwrite a person's settings; they hand it back by removing their "
                f"value (kubectl patch device {spec.device} -n {namespace_of(intent)} --type merge -p "
                f"'{{\"spec\":{{\"target\":{{\"{spec.actuator}\":null}}}}}}', or dropping the field from the "
                f"manifest they apply), or set the new value themselves.", {})
        finally:
            self.devices.release(pin)

    async def _await_device(self, intent: StoredIntent, view: DeviceView, reached: asyncio.Future[dict[str, Any]],
                            value: Any, resumed: bool, command_id: str) -> None:
        spec = intent.spec
        timeout = self.settings.execution_timeout_s
        try:
            after = await asyncio.wait_for(asyncio.shield(reached), timeout)
        except TimeoutError:
            # The target stays set, so a timed hold still runs out and puts the value back (never on for good).
            hold = held(intent, view, value, status_of(intent).before or {}, self.intents)
            await self._finish(
                intent, view, "TIMEOUT", f"The device did not acknowledge command {command_id} ({spec.actuator}="
                f"{shown(value)}) within {timeout:g} s. The target stays set; the controller keeps driving the "
                "device there." + (f" {hold['message']}" if hold else ""), {"hold": hold},
                {"hold": wire_hold(hold)} if hold else None)
            return
        except DeviceRefused as refusal:
            # The device's words are data: quoted and labelled in the message, and kept apart in deviceError.
            said = str(refusal)
            await self._finish(intent, view, "FAILED", f"The device refused; it reported (untrusted text): "
                               f"{json.dumps(said, ensure_ascii=False)}.", {"device_error": said})
            return
        except Superseded as superseded:
            await self._finish(intent, view, "FAILED", f"Not executed: {superseded}.", {})
            return
        except DeviceGone as gone:
            await self._finish(intent, view, "DEVICE_GONE", f"Not acknowledged: {gone}.", {})
            return
        before = status_of(intent).before or {}
        changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
        what = ", ".join(f"{k} {shown(b)} -> {shown(a)}" for k, (b, a) in sorted(changed.items())) or "nothing changed"
        hold = held(intent, view, value, before, self.intents)
        await self._finish(intent, view, "EXECUTED",
                           f"{spec.action} {spec.actuator}={shown(value)} done; the device acknowledged "
                           f"command {command_id} ({what})" + (" after a restart." if resumed else ".")
                           + (f" {hold['message']}" if hold else ""),
                           {"before": before, "after": after, "hold": hold},
                           {"hold": wire_hold(hold)} if hold else None)
