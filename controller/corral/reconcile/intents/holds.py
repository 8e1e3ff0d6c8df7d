"""Timed holds, carried out: the Pending hold an execution leaves, and its revert when it runs out.

An Intent with `holdFor` that ends EXECUTED carries `status.hold` (Pending: `until`, `revertTo`) in its final status
write, and its decision record says so. The hold's state lives in the Intent's status, so a restarted controller
finds it again: the Intent reconciler sees a final Intent with a Pending hold (`HoldReverts.due`), waits until
`until`, and hands it to the execution queue of its Device, where Intents for one Device never race. Only the owner
of the Device's shard gets there (the gates in front of both queues, and the doors before every write).

At `until` (`HoldReverts.revert`) the facts are gathered (the Device as the API server has it now, not the cache;
the Intents executed since on the same actuator; the current contract; the interlocks guarding the value) and
`decide.holds.judge_revert` decides. A revert or a failsafe is a new decision in the requester's name: on record
(`intent.reverting`, fsynced) and in the status (still Pending, citing it) before the target is applied with the
Intent's field manager and a command id of its own (`r-...`, so a restart resends the same one); the device's ack
ends it (`intent.reverted`, then the status: Reverted, Failsafe or Failed). A Cancelled or Refused hold is one
record and one status write. Each end is an Event on the Intent.

A `then` the Intent's decision did not cover (decided before `then` was bound by approvals and grants:
status.paramsHash is not the hash with `then`) is decided at the revert as a new request of the requester
(`_checks`: RBAC, pause, contract hold, interlocks, lease, approval, device online); it skips nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from corral.api.codes import INTENT_ANNOTATION, INTENTS_MANAGER
from corral.api.durations import seconds_of
from corral.api.intent import HoldState, HoldStatus
from corral.contract.model import Actuator
from corral.contract.values import shown
from corral.decide.decision import Decision, InterlockVerdict, decide
from corral.decide.holds import (
    HoldFacts,
    LaterIntent,
    TargetNow,
    judge_revert,
    pending_hold,
    revert_command_id,
    revert_covered,
)
from corral.decide.idempotency import params_hash
from corral.kube.cache import TypedCache
from corral.kube.client import ApiError
from corral.kube.objects import FieldConflict, Kube
from corral.kube.typed import Body
from corral.kube.workqueue import Result
from corral.reconcile.devices.driver import DeviceGone, DeviceRefused, Superseded
from corral.reconcile.devices.port import DevicePort, DeviceView
from corral.reconcile.devices.targets import managed_fields
from corral.reconcile.intents.facts import (
    StoredIntent,
    checked_value,
    created_at,
    device_labels,
    facts_of,
    name_of,
    namespace_of,
    spec_body,
    status_of,
    uid_of,
    value_of,
)
from corral.reconcile.intents.gather import Gatherer
from corral.reconcile.intents.outcomes import EventType, Outcomes, cited
from corral.reconcile.intents.settings import IntentSettings

log = logging.getLogger(__name__)

REVERTING = "intent.reverting"  # the revert decided: the value and the command id, before the target is applied
REVERTED = "intent.reverted"  # how the hold ended: Reverted, Failsafe, Cancelled, Refused or Failed
# How a Pending hold whose revert was decided (status.hold.audit set) says it is driving the failsafe value: what a
# restarted controller carries on with (revertTo is then the failsafe value).
FAILSAFE_NOTE = "Failsafe:"


def held(intent: StoredIntent, view: DeviceView, value: Any, before: dict[str, Any],
         intents: TypedCache[StoredIntent]) -> dict[str, Any] | None:
    """The Pending hold an executed Intent leaves in its final status (None without holdFor)."""
    spec = intent.spec
    contract = view.contract
    actuator = contract.actuator(spec.actuator) if contract is not None else None
    if spec.hold_for is None or actuator is None:
        return None
    hold_s = seconds_of(spec.hold_for)
    then = spec.then.value if spec.then is not None else None
    pending = pending_hold(actuator, value, then, before, hold_s, _replaced(intent, intents))
    until = datetime.now(UTC) + timedelta(seconds=hold_s)
    return {"until": until, "revert_to": pending.revert_to, "state": "Pending",
            "message": f"{pending.message[:900]} Due at {until:%H:%M:%S} UTC."}


def _replaced(intent: StoredIntent, intents: TypedCache[StoredIntent]) -> tuple[str, Any] | None:
    """Another Intent's hold still Pending on the same actuator (the newest), which this Intent's execution cancels:
    its name and what it would have put back."""
    found: tuple[datetime, str, Any] | None = None
    for (namespace, name), other in intents.items():
        hold = status_of(other).hold
        if (hold is None or hold.state != "Pending" or namespace != namespace_of(intent)
                or uid_of(other) == uid_of(intent) or other.spec.device != intent.spec.device
                or other.spec.actuator != intent.spec.actuator or other.spec.action != intent.spec.action):
            continue
        if found is None or hold.until > found[0]:
            found = (hold.until, name, hold.revert_to)
    return (found[1], found[2]) if found is not None else None


def wire_hold(hold: dict[str, Any]) -> dict[str, Any]:
    """The hold as the decision record keeps it (JSON, camelCase)."""
    return HoldStatus.model_validate(hold).model_dump(mode="json", by_alias=True, exclude_none=True)


class HoldReverts:
    """Waits for each Pending hold to run out, then judges and carries out its revert."""

    def __init__(self, settings: IntentSettings, kube: Kube, devices: DevicePort, intents: TypedCache[StoredIntent],
                 outcomes: Outcomes, gatherer: Gatherer) -> None:
        self.settings = settings
        self.kube = kube
        self.devices = devices
        self.intents = intents
        self.outcomes = outcomes
        self.gatherer = gatherer

    def due(self, intent: StoredIntent) -> Result | None:
        """On the Intent queue: how long until the hold runs out; None when it has (hand it to execution)."""
        hold = status_of(intent).hold
        assert hold is not None
        wait = (hold.until - datetime.now(UTC)).total_seconds()
        if wait > 0:
            return Result.after(wait)
        view = self.devices.view(namespace_of(intent), intent.spec.device)
        if view is not None and not view.exists:
            # Not heard of since the controller started (it was offline across a restart): its contract, which the
            # revert is checked against, comes when it announces itself; the revert waits for it.
            if not self.devices.still_listening():
                log.debug("Intent %s: its hold ran out; waiting for Device %s to announce itself", name_of(intent),
                         intent.spec.device)
            return Result.after(1.0 if self.devices.still_listening() else 5.0)
        return None

    # ---- at `until`, on the Device's execution queue ------------------------------------------------------------

    async def revert(self, intent: StoredIntent) -> None:
        hold = status_of(intent).hold
        if hold is None or hold.state != "Pending":
            return
        view = self.devices.view(namespace_of(intent), intent.spec.device)
        if hold.audit is not None:
            # Decided (on record and in status) before a restart: carried on with the same command, never judged again.
            await self._drive(intent, view, hold.revert_to, hold.message.startswith(FAILSAFE_NOTE))
            return
        verdict = judge_revert(await self._facts(intent, view, hold))
        if verdict.kind in ("Cancelled", "Refused"):
            await self._end(intent, view, "Cancelled" if verdict.kind == "Cancelled" else "Refused", verdict.message,
                            None)
            return
        command_id = revert_command_id(uid_of(intent))
        sealed = await self.outcomes.record(REVERTING, intent, {
            "value": verdict.value, "failsafe": verdict.kind == "failsafe", "commandId": command_id,
            "reason": f"the timed hold (holdFor {intent.spec.hold_for}) of Intent {name_of(intent)} ran out",
            "message": verdict.message, "holdUntil": hold.until.isoformat()})
        intent = await self.outcomes.write(intent, {"hold": {
            **hold.model_dump(by_alias=False), "revert_to": verdict.value, "audit": cited(sealed),
            "message": f"{FAILSAFE_NOTE + ' ' if verdict.kind == 'failsafe' else ''}{verdict.message} Command "
                       f"{command_id}; waiting for the device."}}, "hold-reverting")
        await self._drive(intent, view, verdict.value, verdict.kind == "failsafe")

    async def _facts(self, intent: StoredIntent, view: DeviceView | None, hold: HoldStatus) -> HoldFacts:
        spec, namespace = intent.spec, namespace_of(intent)
        try:
            body: Body | None = await self.kube.get_device(namespace, spec.device)
        except ApiError as err:
            if err.status != 404:
                raise
            body = None
        actuator = _actuator(view, intent)
        checked = checked_value(view, intent)
        verdicts: tuple[InterlockVerdict, ...] = ()
        interlocks = self.gatherer.interlocks
        if interlocks is not None and view is not None and actuator is not None and hold.revert_to is not None:
            verdicts = interlocks.verdicts(namespace, view.body, spec.actuator, hold.revert_to, self.devices.view)
        uncovered = revert_covered(spec.then is not None, status_of(intent).params_hash,
                                   params_hash(namespace, spec_body(intent)))
        checks = None
        if uncovered is not None and view is not None and actuator is not None and hold.revert_to is not None:
            checks = await self._checks(intent, view, hold.revert_to, verdicts)
        return HoldFacts(intent=intent.metadata.name or "", device=spec.device, actuator_id=spec.actuator,
                         held=checked if checked is not None else value_of(intent), revert_to=hold.revert_to,
                         target=target_now(body, spec.actuator) if body is not None else None,
                         later=self._later(intent), actuator=actuator, interlocks=verdicts, uncovered=uncovered,
                         checks=checks)

    async def _checks(self, intent: StoredIntent, view: DeviceView, value: Any,
                      interlocks: tuple[InterlockVerdict, ...]) -> Decision:
        """The normal pipeline's decision on putting `value` back, as a new request of the Intent's requester made
        now: no hold of its own, no approval (nobody was asked), no grant spent, the guards as they are now."""
        namespace, gatherer = namespace_of(intent), self.gatherer
        facts, device = facts_of(intent, view, device_labels(view))
        facts = replace(facts, value=value, hold_for_s=None, then=None, based_on=(), cancelled=None, dry_run=False,
                        created_at=datetime.now(UTC), rule=gatherer.origin_of(intent))
        may = await gatherer.requester_may(facts, device, namespace, intent.spec.requester_groups)
        guards = replace(gatherer.guards(intent, view), interlocks=interlocks)
        return decide(facts, device, may, (), "", datetime.now(UTC), gatherer.policy, guards)

    def _later(self, intent: StoredIntent) -> LaterIntent | None:
        """Another Intent executed on the same device and actuator after this one (decided later; in the same
        second, created later). The cache keeps decided Intents for their retention; the target tells the rest."""
        mine = status_of(intent)
        if mine.decided_at is None:
            return None
        order = (mine.decided_at, created_at(intent))
        for (namespace, _), other in self.intents.items():
            status = status_of(other)
            # The same action on the same actuator (a read of it changes nothing), executed for real.
            if (namespace != namespace_of(intent) or uid_of(other) == uid_of(intent) or status.code != "EXECUTED"
                    or status.phase != "Succeeded" or other.spec.device != intent.spec.device
                    or other.spec.actuator != intent.spec.actuator or other.spec.action != intent.spec.action
                    or status.decided_at is None):
                continue
            if (status.decided_at, created_at(other)) > order:
                return LaterIntent(other.metadata.name or "", other.spec.requester)
        return None

    async def _drive(self, intent: StoredIntent, view: DeviceView | None, value: Any, failsafe: bool) -> None:
        """Apply the target with the Intent's field manager and wait for the device's ack to the revert's command."""
        spec, command_id = intent.spec, revert_command_id(uid_of(intent))
        done: HoldState = "Failsafe" if failsafe else "Reverted"
        what = f"{spec.actuator}={shown(value)}" + (" (its failsafe value)" if failsafe else "")
        if view is None or view.device_id is None:
            await self._end(intent, view, "Failed", f"Not put back: Device {spec.device} is gone.", value)
            return
        pin = self.devices.pin(view.device_id, spec.actuator, value, command_id, name_of(intent), None)
        try:
            await self.devices.apply_target(pin, view.body, intent.metadata.name or "")
            if not view.online:
                await self._end(intent, view, done, f"spec.target.{what} is set, but Device {spec.device} is offline: "
                                "the controller drives it there when it is back (not confirmed by the device yet).",
                                value)
                return
            after = await asyncio.wait_for(asyncio.shield(pin.future), self.settings.execution_timeout_s)
        except FieldConflict as conflict:
            await self._end(intent, view, "Cancelled", f"Not put back: spec.target.{spec.actuator} of Device "
                            f"{spec.device} is managed by someone else now ({conflict}); their setting stands.", None)
            return
        except TimeoutError:
            await self._end(intent, view, "Failed", f"The device did not acknowledge the revert to {what} (command "
                            f"{command_id}) within {self.settings.execution_timeout_s:g} s. The target stays set; "
                            "the controller keeps driving the device there.", value)
            return
        except (DeviceRefused, Superseded, DeviceGone) as err:
            await self._end(intent, view, "Failed", f"Not put back to {what}: {type(err).__name__}: {err}.", value)
            return
        finally:
            self.devices.release(pin)
        await self._end(intent, view, done, f"Put back {what}; the device acknowledged command {command_id} "
                        f"(reported {shown(after.get(spec.actuator))}).", value, after)

    async def _end(self, intent: StoredIntent, view: DeviceView | None, state: HoldState, message: str, value: Any,
                   after: dict[str, Any] | None = None) -> None:
        """The hold's end: on record, then in the status, then an Event for people."""
        hold = status_of(intent).hold
        assert hold is not None
        sealed = await self.outcomes.record(REVERTED, intent, {
            "state": state, "value": value, "message": message, "after": after, "holdUntil": hold.until.isoformat(),
            "reason": f"the timed hold (holdFor {intent.spec.hold_for}) of Intent {name_of(intent)} ran out"})
        ended = {**hold.model_dump(by_alias=False), "state": state, "message": message[:1000], "audit": cited(sealed),
                 "ended_at": datetime.now(UTC).replace(microsecond=0)}
        written = await self.outcomes.write(intent, {"hold": ended}, "hold-ended")
        kind: EventType = "Normal" if state in ("Reverted", "Failsafe", "Cancelled") else "Warning"
        self.outcomes.event(written, f"Hold{state}", "Revert", f"Hold {state}: {message} (in the name of "
                            f"{intent.spec.requester})", kind)
        log.info("Intent %s: hold %s: %s", name_of(intent), state, message)


def _actuator(view: DeviceView | None, intent: StoredIntent) -> Actuator | None:
    if view is None or not view.exists or view.contract is None:
        return None
    return view.contract.actuator(intent.spec.actuator)


def target_now(body: Body, actuator: str) -> TargetNow:
    """spec.target[actuator] of the Device as read, who owns that field, and the Intent that last applied."""
    target = (body.get("spec") or {}).get("target") or {}
    managers = [entry.get("manager") for entry in managed_fields(body)
                if f"f:{actuator}" in (((entry.get("fieldsV1") or {}).get("f:spec") or {}).get("f:target") or {})]
    # Shared ownership (another manager applied the same value) counts as theirs: they have a stake in it now.
    manager = next((m for m in managers if m != INTENTS_MANAGER), managers[0] if managers else None)
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    return TargetNow(actuator in target, target.get(actuator), manager, annotations.get(INTENT_ANNOTATION))


def pending(intent: StoredIntent) -> bool:
    hold = status_of(intent).hold
    return hold is not None and hold.state == "Pending"


__all__ = ["REVERTED", "REVERTING", "HoldReverts", "held", "pending", "wire_hold"]
