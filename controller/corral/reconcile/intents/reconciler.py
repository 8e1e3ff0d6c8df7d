"""The Intent pipeline: gather the facts, let `decide` judge, execute through the Device's target, audit.

An Intent moves Pending -> (AwaitingApproval ->) Executing -> Succeeded, or ends Denied/Failed with one
code. Two reconcilers share this module, each on a work queue of its own:

- `decide(key)`, per Intent: runs the decision pipeline and either finishes the Intent, waits for a
  human, or hands it to execution;
- `execute(device)`, per Device: executes the Intents ready for that Device one after another, so Intents
  for one device never race. Right before anything runs it checks scope, pause, hold, interlocks and the
  lease again, then puts `Executing` on record, with the command id and the state before, and only then
  pins the command and applies the target. A controller restarted at any point resumes an Intent found
  Executing with the same command id; it never decides it twice.

Every decision is in the audit log, fsynced, before the status write that reveals it: the decision to
execute (`intent.executing`, with the command id) and the outcome (`intent.decided`). An Intent whose
status does not show what the log holds (the controller died between the two writes) gets the recorded
outcome, or resumes the recorded execution; it is not judged again. While the log cannot be written no
Intent is decided: each waits, Pending, with a condition that says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry import context as otel_context
from pydantic import ValidationError

from corral.api.approval import ApprovalStatus
from corral.api.base import Condition
from corral.api.codes import API_VERSION, CANCEL_ANNOTATION, FINAL_PHASES, DecisionCode, event_reason, phase_of
from corral.api.intent import LEASE_ACTIONS, OVERLAY_ACTIONS, OVERLAY_VERB, IntentStatus
from corral.audit.chain import AuditRecord, line_hash
from corral.audit.decisions import DECIDED, EXECUTING, DecisionIndex
from corral.audit.log import AuditLog, Sealed, Unwritable
from corral.contract.values import InvalidValue, check, shown
from corral.decide.approvals import ApprovalView, Refusal
from corral.decide.decision import (
    Decision,
    DeviceFacts,
    Evidence,
    Guards,
    IntentFacts,
    Observation,
    Policy,
    decide,
    lease_verb,
    recheck,
)
from corral.decide.grants import GrantView
from corral.decide.idempotency import params_hash
from corral.kube.access import AccessReviews
from corral.kube.cache import Body, Key, ObjectCache, key_of
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.objects import FieldConflict, Kube
from corral.kube.workqueue import Result, WorkQueue
from corral.obs import metrics, tracing
from corral.reconcile.devices.driver import DeviceGone, DeviceRefused, Superseded
from corral.reconcile.devices.notices import device_ref
from corral.reconcile.devices.port import DevicePort, DeviceView
from corral.reconcile.guards.interlocks import Interlocks
from corral.reconcile.guards.leases import Leases, LeaseTaken
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.intents.grants import Grants
from corral.reconcile.intents.ratelimits import RequestIndex

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 1024
HOLD_RECHECK_S = 2.0
AUDIT_RECHECK_S = 1.0
AUDIT_CONDITION = "AuditLogWritable"
DRY_RUN_TTL = timedelta(minutes=10)  # a dry run's answer is read at once; it is not kept for a day


@dataclass(frozen=True)
class IntentSettings:
    policy: Policy = field(default_factory=Policy)
    execution_timeout_s: float = 10.0
    ttl: timedelta = timedelta(hours=24)
    decision_workers: int = 8
    # Executions wait for devices; each worker waits for one device at a time.
    execution_workers: int = 32


@dataclass(frozen=True)
class Ready:
    """An Intent handed to execution: what the decision established (None when resumed after a restart)."""

    key: Key
    decision: Decision | None


def new_command_id() -> str:
    """Unguessable, and short enough for the firmware's dedup memory."""
    return "i-" + secrets.token_hex(12)


class IntentReconciler:
    def __init__(self, settings: IntentSettings, kube: Kube, access: AccessReviews, recorder: EventRecorder,
                 devices: DevicePort, audit: AuditLog, recorded: DecisionIndex,
                 interlocks: Interlocks | None = None, on_awaiting: Callable[[Body], None] | None = None,
                 grants: Grants | None = None, leases: Leases | None = None,
                 pauses: AgentPauses | None = None) -> None:
        self.settings = settings
        self.pauses = pauses  # the agents kill switch of each namespace (None: agents are never paused)
        self.leases = leases  # exclusive control of Devices (None: no Lease objects are watched, none hold)
        self.grants = grants if grants is not None else Grants(kube, access)
        self.on_awaiting = on_awaiting  # told once when an Intent starts waiting for a person (notifications)
        self.interlocks = interlocks  # the cross-device rules, judged in _guards
        self.audit = audit
        self.recorded = recorded  # what the log says was decided, by Intent UID
        self.kube = kube
        self.access = access
        self.recorder = recorder
        self.devices = devices
        self.intents = ObjectCache()
        # Each requester's Intents, for its rate limit (counted from the Intents themselves, so a restart agrees).
        self.requests = RequestIndex(settings.policy.rate_limit, self.intents.get)
        self.traces = tracing.FirstTraces()  # the trace each Intent was created in: read once, at creation
        self.approvals = ObjectCache()
        self.decisions: WorkQueue[Key] = WorkQueue("intents")
        self.executions: WorkQueue[Key] = WorkQueue("executions")  # keys are (namespace, device name)
        self._ready: dict[Key, list[Ready]] = {}
        self._awaiting: set[Key] = set()  # for the approvals-waiting gauge

    # ---- inputs ---------------------------------------------------------------------------------------------

    def on_intent_event(self, event_type: str, body: Body) -> None:
        self.requests.observe(event_type, body)
        if event_type == "DELETED":
            self.traces.forget(body["metadata"]["uid"])
            self.intents.remove(body)
            self._track(key_of(body), None)
            self.recorded.forget(body["metadata"]["uid"])
            command_id = (body.get("status") or {}).get("commandId")
            view = self.devices.view(body["metadata"]["namespace"], body["spec"]["device"])
            if command_id and view is not None and view.device_id:
                self.devices.release_command(view.device_id, command_id)  # a primed pin nobody will resume
            return
        if self.intents.upsert(body) is not None:
            self._track(key_of(body), body)
            self.decisions.add(key_of(body))

    def on_approval_event(self, event_type: str, body: Body) -> None:
        if event_type == "DELETED":
            self.approvals.remove(body)
            return
        if self.approvals.upsert(body) is None:
            return
        intent_name = ((body.get("spec") or {}).get("intent") or {}).get("name")
        if intent_name:
            self.decisions.add((body["metadata"]["namespace"], intent_name))

    def on_grant_event(self, event_type: str, body: Body) -> None:
        if self.grants.on_event(event_type, body):
            namespace = body["metadata"]["namespace"]
            for key in sorted(self._awaiting):
                if key[0] == namespace:
                    self.decisions.add(key)  # a new grant may cover what waits

    def on_pause_change(self, namespace: str) -> None:
        """Agents were paused or resumed there: what is not decided yet is decided again (a pause ends it)."""
        for key, body in self.intents.items():
            if key[0] == namespace and (body.get("status") or {}).get("phase") not in FINAL_PHASES:
                self.decisions.add(key)

    def prime(self, intents: list[Body]) -> None:
        """Before the device side starts: Intents that were executing when the controller stopped pin their
        command again, so that the device reconciler sends nothing for that actuator until the resumed
        execution has re-applied its target, and then sends it with the Intent's own command id."""
        for body in intents:
            self.on_intent_event("ADDED", body)
            status, spec = body.get("status") or {}, body["spec"]
            if status.get("phase") != "Executing" or not status.get("commandId"):
                continue
            view = self.devices.view(body["metadata"]["namespace"], spec["device"])
            if view is not None and view.device_id:
                value = (spec.get("params") or {}).get("value")
                self.devices.pin(view.device_id, spec["actuator"], value, status["commandId"], _name(body), None)

    def _track(self, key: Key, body: Body | None) -> None:
        if body is not None and (body.get("status") or {}).get("phase") == "AwaitingApproval":
            self._awaiting.add(key)
        else:
            self._awaiting.discard(key)
        metrics.APPROVALS_WAITING.set(len(self._awaiting))

    # ---- deciding -------------------------------------------------------------------------------------------

    async def decide(self, key: Key) -> Result:
        body = self.intents.get(key)
        if body is None:
            return Result.done()
        # Joins the trace of whoever created the Intent (the gateway's tool call), if it carries one.
        with tracing.tracer().start_as_current_span(
                "corral.intent.decide", context=tracing.context_of(self.traces.of(body)),
                attributes={"corral.intent": _name(body)}):
            try:
                return await self._decide(key, body)
            except Unwritable:
                return await self._wait_for_audit(key)

    async def _decide(self, key: Key, body: Body) -> Result:
        status = body.get("status") or {}
        phase = status.get("phase")
        if phase in FINAL_PHASES:
            return await self._housekeep(body)
        if self._handed_over(key):
            return Result.done()
        namespace, spec = key[0], body["spec"]
        view = self.devices.view(namespace, spec["device"])
        if view is not None and not view.exists and self.devices.still_listening():
            # Just (re)started: the device may announce itself in a moment; do not call it gone yet.
            return Result.after(1.0)
        uid = body["metadata"]["uid"]
        recorded = self.recorded.decided.get(uid)
        if recorded is not None:
            return await self._restore(body, view, recorded)
        if not self.audit.writable and not await self.audit.recovered():
            return await self._wait_for_audit(key)
        executing = self.recorded.executing.get(uid)
        if phase != "Executing" and executing is not None:
            # Decided to execute, on record, but the controller stopped before status said so: carry on.
            data = executing.data
            body = await self._write(body, {"phase": "Executing", "message": data.get("message", ""),
                                            "before": data.get("before"), "approval": data.get("approval"),
                                            "command_id": data["commandId"]}, "executing-restored")
            phase = "Executing"
        if phase == "Executing":
            self._hand_over(key, body, None)  # resumed after a restart: carried on, never decided again
            return Result.done()
        facts, device_facts = _facts(body, view)
        requester_may = await self._requester_may(facts, device_facts, namespace, spec.get("requesterGroups"))
        approvals = await self._approvals_for(body, facts.device)
        digest = params_hash(namespace, spec)
        now = datetime.now(UTC)
        grants = await self._grants_for(body, view, now)
        limited = self.requests.verdict(body)
        while True:
            decision = decide(facts, device_facts, requester_may, approvals, digest, now, self.settings.policy,
                              self._guards(body, view), self._evidence(facts, device_facts), grants, limited)
            if decision.grant is None or spec.get("dryRun") or await self._spend(body, decision.grant):
                break
            grants = [g for g in grants if g.name != decision.grant]  # used up or revoked meanwhile: the next one
        await self._refuse(body, decision.refused)
        if self.leases is not None and not spec.get("dryRun") and facts.action != "release":
            # Any call by the holder that touches the Device keeps its lease: the idle TTL starts again.
            await self.leases.renew(namespace, spec["device"], facts.requester, facts.holder_id)
        base = {"params_hash": digest, "risk": decision.risk, "level": decision.level}
        if spec.get("dryRun"):
            return await self._dry_run(body, view, decision, base)
        if decision.outcome == "final":
            assert decision.code is not None
            return await self._finish(body, view, decision.code, decision.message, base)
        if decision.outcome == "await_hold":
            assert decision.expires_at is not None
            if status.get("message") != decision.message:
                await self._write(body, {**base, "phase": "Pending", "message": decision.message}, "held")
                self._event(body, "WaitingForContract", "Decide", decision.message, "Warning")
            # Looked at again soon: a person's acceptance lifts the hold at any moment.
            return Result.after(max(0.1, min(HOLD_RECHECK_S, (decision.expires_at - now).total_seconds() + 0.1)))
        if decision.outcome == "await_approval":
            assert decision.expires_at is not None
            if phase != "AwaitingApproval":
                written = await self._write(body, {**base, "phase": "AwaitingApproval", "message": decision.message,
                                                   "approval_expires_at": decision.expires_at}, "awaiting-approval")
                self._event(body, "AwaitingApproval", "Decide", decision.message)
                if self.on_awaiting is not None:
                    self.on_awaiting(written)
            elif status.get("message") != decision.message[:MESSAGE_LIMIT]:
                await self._write(body, {"message": decision.message}, "awaiting-approval")  # e.g. a refused approval
            return Result.after(max(0.1, (decision.expires_at - now).total_seconds() + 0.1))
        if facts.action == "read":
            assert view is not None and view.device_id is not None
            return await self._read(body, view, base)
        if facts.action in OVERLAY_ACTIONS:
            assert view is not None
            return await self._set_overlay(body, view, decision, base)
        if facts.action in LEASE_ACTIONS:
            return await self._lease(body, view, decision, base)
        self._hand_over(key, body, decision)
        return Result.done()

    async def _dry_run(self, body: Body, view: DeviceView | None, decision: Decision, base: dict[str, Any]) -> Result:
        """Every check ran; the outcome is recorded and shown, and nothing is executed, now or ever."""
        code: DecisionCode | None = "EXECUTED" if decision.outcome == "execute" else decision.code
        if decision.outcome == "execute":
            message = f"Dry run: every check passed; it would {_doing(body['spec'], decision)}. Nothing was executed."
        elif decision.outcome == "final":
            message = f"Dry run: it would end {code}: {decision.message}"
        else:
            message = f"Dry run: it would wait: {decision.message} Nothing was executed."
        status = {**base, "phase": "DryRun", "code": code, "would": decision.outcome,
                  "message": message[:MESSAGE_LIMIT], "decided_at": datetime.now(UTC).replace(microsecond=0)}
        sealed = await self._record(DECIDED, body, {"code": code, "message": status["message"], "dryRun": True,
                                                    "would": decision.outcome, **base})
        status["audit"] = _cited(sealed)
        written = await self._write(body, status, "dry-run")
        self._event(written, "DryRun", "Decide", f"{message} (requested by {body['spec']['requester']})",
                    "Normal", device_ref(view.body) if view is not None else None)
        return Result.after(DRY_RUN_TTL.total_seconds())

    async def _set_overlay(self, body: Body, view: DeviceView, decision: Decision, base: dict[str, Any]) -> Result:
        """The overlay, as the checks made it safe, written by the controller (field manager corral-overlay)."""
        spec = body["spec"]
        field_name = OVERLAY_ACTIONS[spec["action"]]
        text = str(decision.value or "")
        before = ((view.body.get("spec") or {}).get("overlay") or {}).get(field_name, "")
        try:
            await self.kube.patch_overlay(body["metadata"]["namespace"], spec["device"], field_name, text)
        except ApiError as err:
            return await self._finish(body, view, "FAILED", f"The overlay could not be written: {err.status} "
                                                            f"{err.message}", base)
        what = f"{field_name} {shown(before)} -> {shown(text)}" if text else f"{field_name} {shown(before)} removed"
        return await self._finish(body, view, "EXECUTED", f"Overlay of {spec['device']} set: {what}.",
                                  {**base, "before": {field_name: before}, "after": {field_name: text}})

    async def _lease(self, body: Body, view: DeviceView | None, decision: Decision, base: dict[str, Any]) -> Result:
        """Take, give back or break the Device's lease, as the checks allowed: the controller writes the Lease."""
        spec, namespace = body["spec"], body["metadata"]["namespace"]
        device, who, holder_id = spec["device"], spec["requester"], spec.get("holderId")
        if self.leases is None:
            return await self._finish(body, view, "FAILED", "This controller keeps no leases.", base)
        try:
            if spec["action"] == "acquire":
                assert isinstance(decision.value, int)
                lease = await self.leases.acquire(namespace, device, who, holder_id, decision.value, spec["reason"])
                message = (f"Device {device} is leased to {lease.who()} until {lease.expires_at:%H:%M:%S} UTC; every "
                           f"call of yours renews it, and it ends after {decision.value} s without one.")
                self.audit.note("lease.acquired", f"{namespace}/{device}", {
                    "holder": who, "holderId": holder_id, "ttlSeconds": decision.value, "reason": spec["reason"],
                    "intent": _name(body)})
            elif spec["action"] == "release":
                await self.leases.release(namespace, device, who, holder_id)
                message = f"The lease of Device {device} is given back."
                self.audit.note("lease.released", f"{namespace}/{device}", {"holder": who, "holderId": holder_id,
                                                                           "intent": _name(body)})
            else:
                broken = await self.leases.break_(namespace, device, who, spec["reason"])
                if broken is None:
                    return await self._finish(body, view, "EXECUTED", f"Device {device} has no lease; nothing to "
                                                                      "break.", base)
                message = f"The lease of {broken.who()} on Device {device} is broken: {spec['reason']}"
                self.audit.note("lease.broken", f"{namespace}/{device}", {
                    "holder": broken.holder, "holderId": broken.holder_id, "by": who, "reason": spec["reason"],
                    "intent": _name(body)})
        except LeaseTaken as taken:
            return await self._finish(body, view, "DENY_LEASED", str(taken), base)
        except ApiError as err:
            return await self._finish(body, view, "FAILED", f"The Lease could not be written: {err.status} "
                                                            f"{err.message}", base)
        return await self._finish(body, view, "EXECUTED", message, base)

    def _evidence(self, facts: IntentFacts, device: DeviceFacts) -> Evidence:
        own = device.device_id or ""
        return self.devices.evidence((o.device_id or own, o.metric, o.ts_ms) for o in facts.based_on)

    async def _requester_may(self, facts: IntentFacts, device: DeviceFacts, namespace: str,
                             groups: list[str] | None) -> bool:
        if facts.action in OVERLAY_ACTIONS:
            return await self.access.may(facts.requester, OVERLAY_VERB, namespace, facts.device, groups)
        if facts.action in LEASE_ACTIONS:
            return await self.access.may(facts.requester, lease_verb(facts.action), namespace, facts.device, groups)
        if device.contract is None:
            return False
        actuator = device.contract.actuator(facts.actuator)
        level = "read" if facts.action == "read" else (actuator.level if actuator is not None else None)
        if level is None:
            return False
        return await self.access.may(facts.requester, level, namespace, facts.device, groups)

    async def _approvals_for(self, intent: Body, device: str) -> list[ApprovalView]:
        namespace, name = intent["metadata"]["namespace"], intent["metadata"]["name"]
        views = []
        for (ns, _), approval in sorted(self.approvals.items()):
            spec = approval.get("spec") or {}
            if ns != namespace or (spec.get("intent") or {}).get("name") != name:
                continue
            meta, status = approval["metadata"], approval.get("status") or {}
            expires = spec.get("expiresAt")
            views.append(ApprovalView(
                name=meta["name"],
                intent_uid=spec["intent"]["uid"],
                params_hash=spec["paramsHash"],
                decision=spec["decision"],
                approver=spec["approver"],
                approver_may_approve=await self.access.may(spec["approver"], "approve", namespace, device,
                                                           spec.get("approverGroups")),
                created_at=_parse_time(meta["creationTimestamp"]),
                expires_at=_parse_time(expires) if expires else None,
                consumed=bool(status.get("consumed")),
                reason=spec.get("reason") or "",
            ))
        return views

    async def _grants_for(self, body: Body, view: DeviceView | None, now: datetime) -> list[GrantView]:
        """The standing grants that would let this Intent run without a per-request approval."""
        spec = body["spec"]
        contract = view.contract if view is not None else None
        actuator = contract.actuator(spec["actuator"]) if contract is not None else None
        value = _checked_value(view, spec)
        if view is None or actuator is None or value is None:
            return []
        labels = (view.body.get("metadata") or {}).get("labels") or {}
        return await self.grants.covering(body["metadata"]["namespace"], spec["requester"], spec["device"], labels,
                                          actuator.id, value, actuator.risk, now, self.settings.policy.people)

    async def _spend(self, body: Body, grant: str) -> bool:
        """One use of the grant for this Intent, atomically and on record; False when none was left."""
        meta = body["metadata"]
        spent = await self.grants.consume(meta["namespace"], grant, meta["name"], meta["uid"])
        if spent is None:
            return False
        self.audit.note("grant.used", f"{meta['namespace']}/{grant}", {
            "intent": _name(body), "intentUid": meta["uid"], "grantor": spent.grantor, "use": spent.use,
            "uses": spent.uses, "requester": body["spec"]["requester"]})
        self._event(body, "GrantUsed", "Decide", f"Runs under ApprovalGrant {grant} of {spent.grantor}: use "
                                                 f"{spent.use} of {spent.uses}.")
        return True

    async def _refuse(self, body: Body, refused: Sequence[Refusal]) -> None:
        """Approvals that do not count say so on their own status (once), on record and in an Event; the Intent
        they were for keeps waiting."""
        namespace = body["metadata"]["namespace"]
        for refusal in refused:
            approval = self.approvals.get((namespace, refusal.approval))
            if approval is None or (approval.get("status") or {}).get("refused"):
                continue
            message = f"Does not count for Intent {body['metadata']['name']}: {refusal.reason}."
            status = ApprovalStatus(refused=True, message=message[:MESSAGE_LIMIT])
            try:
                written = await self.kube.apply_status(
                    "approvals", namespace, refusal.approval, "Approval",
                    status.model_dump(mode="json", by_alias=True, exclude_none=True), "approval-refused")
            except ApiError as err:
                log.warning("could not mark Approval %s/%s refused: %s", namespace, refusal.approval, err)
                continue
            self.approvals.upsert(written)
            self.audit.note("approval.refused", f"{namespace}/{refusal.approval}", {
                "intent": _name(body), "intentUid": body["metadata"]["uid"], "approver": refusal.approver,
                "reason": refusal.reason})
            meta = approval["metadata"]
            self.recorder.post(ObjectRef(API_VERSION, "Approval", meta["name"], namespace, meta.get("uid")),
                               "ApprovalRefused", "Decide", f"{message} The Intent keeps waiting for a valid approval.",
                               "Warning", ObjectRef(API_VERSION, "Intent", body["metadata"]["name"], namespace,
                                                    body["metadata"].get("uid")))

    async def _read(self, body: Body, view: DeviceView, base: dict[str, Any]) -> Result:
        """Answer from the device itself: its state now, and its latest sensor readings."""
        spec = body["spec"]
        assert view.device_id is not None
        try:
            state = await self.devices.read_state(view.device_id)
        except TimeoutError:
            return await self._finish(body, view, "TIMEOUT", "The device did not answer the read in time.", base)
        fresh = self.devices.view(body["metadata"]["namespace"], spec["device"]) or view
        readings = {metric: sample.value for metric, sample in fresh.latest.items()}
        item = spec["actuator"]
        if item in state:
            found = f"{item}={shown(state[item])}, read from the device just now"
        else:
            sample = fresh.latest.get(item)
            age = (datetime.now(UTC).timestamp() * 1000 - sample.received_ms) / 1000 if sample else None
            found = f"{item}={shown(sample.value)}, received {age:.1f} s ago" if sample else f"{item}: no reading yet"
        return await self._finish(body, fresh, "EXECUTED", f"Read {found}.", {**base, "after": {**readings, **state}})

    # ---- executing ------------------------------------------------------------------------------------------

    def _hand_over(self, key: Key, body: Body, decision: Decision | None) -> None:
        device_key = (key[0], body["spec"]["device"])
        ready = self._ready.setdefault(device_key, [])
        if all(r.key != key for r in ready):
            ready.append(Ready(key, decision))
        self.executions.add(device_key)

    def _handed_over(self, key: Key) -> bool:
        body = self.intents.get(key)
        device_key = (key[0], body["spec"]["device"]) if body is not None else None
        return device_key is not None and any(r.key == key for r in self._ready.get(device_key, []))

    async def execute(self, device_key: Key) -> Result:
        """Execute the next Intent ready for this Device; the queue runs one per Device at a time."""
        ready = self._ready.get(device_key, [])
        while ready:
            item = ready[0]
            body = self.intents.get(item.key)
            if body is not None and (body.get("status") or {}).get("phase") not in FINAL_PHASES:
                with tracing.tracer().start_as_current_span(
                        "corral.intent.execute", context=tracing.context_of(self.traces.of(body)),
                        attributes={"corral.intent": _name(body)}):
                    try:
                        await self._execute(body, item.decision)
                    except Unwritable:
                        self.decisions.add_after(item.key, AUDIT_RECHECK_S)  # it waits, and says why
                    except Exception:
                        # Decided again from what is on record (Pending, or Executing: then resumed).
                        delay = self.decisions.add_rate_limited(item.key)
                        log.exception("executing Intent %s failed; deciding it again in %.2f s", _name(body), delay)
                    else:
                        self.decisions.add(item.key)  # it is final now: its housekeeping is the Intent's own
                    finally:
                        ready.pop(0)
                break
            ready.pop(0)
        if not ready:
            self._ready.pop(device_key, None)
            return Result.done()
        return Result.after(0)

    async def _execute(self, body: Body, decision: Decision | None) -> None:
        namespace, spec, status = body["metadata"]["namespace"], body["spec"], body.get("status") or {}
        view = self.devices.view(namespace, spec["device"])
        value = _checked_value(view, spec)
        if view is None or not view.exists or view.contract is None or value is None or view.device_id is None:
            if view is not None and view.device_id and status.get("commandId"):
                self.devices.release_command(view.device_id, status["commandId"])  # primed at start
            await self._finish(body, view, "DEVICE_GONE", f"Device {spec['device']} disappeared, or its contract "
                               "changed, before execution; nothing was sent.", {})
            return
        resumed = decision is None
        if resumed:
            command_id = status.get("commandId") or new_command_id()
        else:
            assert decision is not None
            denial = await self._recheck(body, view)
            if denial is not None:
                assert denial.code is not None
                await self._finish(body, view, denial.code, denial.message, {})
                return
            command_id = new_command_id()
            # On record first: from here on a restart resumes this execution (with this command id).
            executing = {"phase": "Executing", "message": decision.message, "before": dict(view.reported),
                         "approval": ",".join(decision.approvals) or None, "grant": decision.grant,
                         "command_id": command_id}
            await self._record(EXECUTING, body, {
                "message": decision.message, "before": executing["before"], "approval": executing["approval"],
                "grant": decision.grant, "commandId": command_id, "value": value,
                "approvers": self._approvers(namespace, decision.approvals)})
            for approval in decision.approvals:
                self.audit.note("approval.accepted", f"{namespace}/{approval}",
                                {"intent": _name(body), "intentUid": body["metadata"]["uid"]})
            body = await self._write(body, executing, "executing")
        pin = self.devices.pin(view.device_id, spec["actuator"], value, command_id, _name(body),
                               otel_context.get_current())
        try:
            consumed = asyncio.gather(*(self._consume(body, name) for name in (decision.approvals if decision else ())))
            try:
                await self.devices.apply_target(pin, view.body, body["metadata"]["name"])
            finally:
                await consumed
            await self._await_device(body, view, pin.future, value, resumed, command_id)
        except FieldConflict as conflict:
            await self._finish(body, view, "FAILED",
                               f"Not applied: spec.target.{spec['actuator']} of Device {spec['device']} is managed by "
                               f"someone else ({conflict}). Corral does not overwrite a person's settings; they hand it "
                               f"back by removing their value (kubectl patch device {spec['device']} -n "
                               f"{body['metadata']['namespace']} --type merge -p "
                               f"'{{\"spec\":{{\"target\":{{\"{spec['actuator']}\":null}}}}}}', or dropping the "
                               f"field from the manifest they apply), or set the new value themselves.", {})
        finally:
            self.devices.release(pin)

    def _guards(self, body: Body, view: DeviceView | None) -> Guards:
        """The safety envelope around the Intent's device now: its contract hold and the interlocks that guard this
        action, judged now, its lease, and whether agents are paused in its namespace. Reads and overlay text set no
        target: no interlock guards them."""
        hold = view.hold if view is not None else None
        spec = body["spec"]
        paused = self.pauses.paused(body["metadata"]["namespace"]) if self.pauses is not None else None
        lease, broken = (self.leases.guard(body["metadata"]["namespace"], spec["device"]) if self.leases is not None
                         else (None, None))
        if (self.interlocks is None or view is None or spec["action"] == "read" or spec["action"] in OVERLAY_ACTIONS
                or spec["action"] in LEASE_ACTIONS):
            return Guards(hold=hold, lease=lease, broken=broken, paused=paused)
        checked = _checked_value(view, spec)
        value = checked if checked is not None else (spec.get("params") or {}).get("value")
        verdicts = self.interlocks.verdicts(body["metadata"]["namespace"], view.body, spec["actuator"], value,
                                            self.devices.view)
        return Guards(hold=hold, interlocks=verdicts, lease=lease, broken=broken, paused=paused)

    async def _recheck(self, body: Body, view: DeviceView) -> Decision | None:
        """Scope, pause, hold, interlocks and lease, once more: an approval may have taken minutes."""
        facts, device_facts = _facts(body, view)
        requester_may = await self._requester_may(facts, device_facts, body["metadata"]["namespace"],
                                                  body["spec"].get("requesterGroups"))
        return recheck(facts, device_facts, requester_may, datetime.now(UTC), self._guards(body, view),
                       self.settings.policy)

    async def _await_device(self, body: Body, view: DeviceView, reached: asyncio.Future[dict[str, Any]], value: Any,
                            resumed: bool, command_id: str) -> None:
        spec = body["spec"]
        timeout = self.settings.execution_timeout_s
        try:
            after = await asyncio.wait_for(asyncio.shield(reached), timeout)
        except TimeoutError:
            await self._finish(body, view, "TIMEOUT",
                               f"The device did not acknowledge command {command_id} ({spec['actuator']}={shown(value)}) "
                               f"within {timeout:g} s. The target stays set; the controller keeps driving the "
                               "device there.", {})
            return
        except DeviceRefused as refusal:
            # The device's words are data: quoted and labelled in the message, and kept apart in deviceError.
            said = str(refusal)
            await self._finish(body, view, "FAILED", f"The device refused; it reported (untrusted text): "
                                                     f"{json.dumps(said, ensure_ascii=False)}.", {"device_error": said})
            return
        except Superseded as superseded:
            await self._finish(body, view, "FAILED", f"Not executed: {superseded}.", {})
            return
        except DeviceGone as gone:
            await self._finish(body, view, "DEVICE_GONE", f"Not acknowledged: {gone}.", {})
            return
        before = (body.get("status") or {}).get("before") or {}
        changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
        what = ", ".join(f"{k} {shown(b)} -> {shown(a)}" for k, (b, a) in sorted(changed.items())) or "nothing changed"
        await self._finish(body, view, "EXECUTED",
                           f"{spec['action']} {spec['actuator']}={shown(value)} done; the device acknowledged command "
                           f"{command_id} ({what})" + (" after a restart." if resumed else "."),
                           {"before": before, "after": after})

    async def _consume(self, body: Body, approval: str) -> None:
        """Mark the approval used. Best effort: it names this Intent's UID, so it cannot count for another."""
        status = ApprovalStatus(consumed=True, consumed_at=datetime.now(UTC).replace(microsecond=0),
                                message=f"Used by Intent {body['metadata']['name']}")
        try:
            await self.kube.apply_status("approvals", body["metadata"]["namespace"], approval, "Approval",
                                         status.model_dump(mode="json", by_alias=True, exclude_none=True),
                                         "approval-consumed")
        except ApiError as err:
            log.warning("could not mark Approval %s used by Intent %s: %s", approval, _name(body), err)

    # ---- finishing ------------------------------------------------------------------------------------------

    async def _finish(self, body: Body, view: DeviceView | None, code: DecisionCode, message: str,
                      extra: dict[str, Any]) -> Result:
        status = {**{k: v for k, v in extra.items() if v is not None}, "phase": phase_of(code), "code": code,
                  "message": message[:MESSAGE_LIMIT], "decided_at": datetime.now(UTC).replace(microsecond=0)}
        previous = body.get("status") or {}
        sealed = await self._record(DECIDED, body, {
            "code": code, "message": status["message"], "before": status.get("before", previous.get("before")),
            "after": status.get("after"), "risk": status.get("risk", previous.get("risk")),
            "level": status.get("level", previous.get("level")),
            "paramsHash": status.get("params_hash", previous.get("paramsHash")),
            "approval": previous.get("approval"), "commandId": previous.get("commandId"),
            **({"deviceError": status["device_error"]} if "device_error" in status else {}),
            "approvers": self._approvers(body["metadata"]["namespace"],
                                         [n for n in (previous.get("approval") or "").split(",") if n])})
        status["audit"] = _cited(sealed)  # with the final status write, not one of its own
        return await self._announce(await self._write(body, status, "final"), view, code, message)

    async def _announce(self, body: Body, view: DeviceView | None, code: DecisionCode, message: str) -> Result:
        metrics.INTENTS.labels(code=code).inc()
        created = _parse_time(body["metadata"]["creationTimestamp"])
        metrics.INTENT_SECONDS.observe(max(0.0, (datetime.now(UTC) - created).total_seconds()))
        kind = "Normal" if code == "EXECUTED" else "Warning"
        related = device_ref(view.body) if view is not None else None
        self._event(body, event_reason(code), "Decide",
                    f"{code}: {message} (requested by {body['spec']['requester']})", kind, related)
        return Result.after(self.settings.ttl.total_seconds())

    async def _restore(self, body: Body, view: DeviceView | None, recorded: AuditRecord) -> Result:
        """The outcome the log holds, written to a status that does not show it yet (never decided again)."""
        data = recorded.data
        if data.get("dryRun"):
            await self._write(body, {"phase": "DryRun", "code": data.get("code"), "would": data.get("would"),
                                     "message": data["message"], "decided_at": recorded.at.replace(microsecond=0),
                                     "audit": _cited(Sealed(recorded.seq, line_hash(recorded)))}, "restored")
            return Result.after(DRY_RUN_TTL.total_seconds())
        status = {"phase": phase_of(data["code"]), "code": data["code"], "message": data["message"],
                  "before": data.get("before"), "after": data.get("after"), "risk": data.get("risk"),
                  "level": data.get("level"), "params_hash": data.get("paramsHash"),
                  "command_id": data.get("commandId"), "device_error": data.get("deviceError"),
                  "decided_at": recorded.at.replace(microsecond=0),
                  "audit": _cited(Sealed(recorded.seq, line_hash(recorded)))}
        log.info("Intent %s: its decision (audit seq %d) is restored from the audit log", _name(body), recorded.seq)
        written = await self._write(body, {k: v for k, v in status.items() if v is not None}, "restored")
        return await self._announce(written, view, data["code"], data["message"])

    def _approvers(self, namespace: str, approvals: Sequence[str]) -> list[str]:
        return [((self.approvals.get((namespace, name)) or {}).get("spec") or {}).get("approver", "?")
                for name in approvals]

    async def _record(self, kind: str, body: Body, data: dict[str, Any]) -> Sealed:
        """On disk before anything reveals it; Unwritable when it cannot be. Where it landed, to cite."""
        meta, spec = body["metadata"], body["spec"]
        facts = {"device": spec["device"], "action": spec["action"], "actuator": spec["actuator"],
                 "params": spec.get("params"), "requester": spec["requester"], "reason": spec.get("reason", ""),
                 "basedOn": spec.get("basedOn") or [], **data}
        return await self.audit.seal(kind, _name(body), facts, uid=meta["uid"],
                                     trace=tracing.trace_id_of(self.traces.of(body)))

    async def _wait_for_audit(self, key: Key) -> Result:
        """Undecided while the log cannot be written; the condition says why (written once, not every retry)."""
        body = self.intents.get(key)
        if body is None:
            return Result.done()
        conditions = (body.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == AUDIT_CONDITION and c.get("status") == "False" for c in conditions):
            message = (f"Waiting: the audit log cannot be written ({self.audit.error or 'unknown error'}). Corral "
                       "decides nothing it cannot record; this Intent is decided as soon as the log can be written.")
            condition = Condition(type=AUDIT_CONDITION, status="False", reason="AuditLogUnwritable", message=message,
                                  last_transition_time=datetime.now(UTC).replace(microsecond=0),
                                  observed_generation=body["metadata"].get("generation"))
            phase = (body.get("status") or {}).get("phase") or "Pending"
            updates: dict[str, Any] = {"phase": phase, "conditions": [condition]}
            if phase == "Pending":
                updates["message"] = message
            try:
                await self._write(body, updates, "audit-unwritable")
            except ApiError as err:
                log.warning("could not say on Intent %s that it waits for the audit log: %s", _name(body), err)
        return Result.after(AUDIT_RECHECK_S)

    async def _housekeep(self, body: Body) -> Result:
        decided = (body.get("status") or {}).get("decidedAt")
        if not decided:
            return Result.done()
        age = datetime.now(UTC) - _parse_time(decided)
        ttl = DRY_RUN_TTL if body["spec"].get("dryRun") else self.settings.ttl
        if age < ttl:
            return Result.after((ttl - age).total_seconds())
        meta = body["metadata"]
        await self.kube.delete_intent(meta["namespace"], meta["name"], meta["uid"])
        return Result.done()

    async def _write(self, body: Body, updates: dict[str, Any], reason: str) -> Body:
        """Apply the Intent's status with these fields changed; the Intent as the API server now has it."""
        meta = body["metadata"]
        if isinstance(updates.get("message"), str):
            updates = {**updates, "message": updates["message"][:MESSAGE_LIMIT]}
        current = _status_of(body)
        if "conditions" not in updates and any(c.type == AUDIT_CONDITION and c.status == "False"
                                                for c in current.conditions):
            # It waited for the audit log; whatever is written now was recorded first.
            updates = {**updates, "conditions": [
                c if c.type != AUDIT_CONDITION else c.model_copy(update={
                    "status": "True", "reason": "AuditLogWritable", "message": "The audit log can be written again.",
                    "last_transition_time": datetime.now(UTC).replace(microsecond=0)})
                for c in current.conditions]}
        merged = {**current.model_dump(by_alias=False), **updates, "observed_generation": meta.get("generation")}
        status = IntentStatus.model_validate(merged)
        written = await self.kube.apply_status("intents", meta["namespace"], meta["name"], "Intent",
                                               status.model_dump(mode="json", by_alias=True, exclude_none=True), reason)
        self.intents.upsert(written)
        self._track(key_of(written), written)
        return written

    def _event(self, body: Body, reason: str, action: str, note: str, type_: Any = "Normal",
               related: ObjectRef | None = None) -> None:
        meta = body["metadata"]
        self.recorder.post(ObjectRef(API_VERSION, "Intent", meta["name"], meta["namespace"], meta.get("uid")),
                           reason, action, note, type_, related)


def _cited(sealed: Sealed) -> dict[str, Any]:
    """status.audit: the decision record a client that sees this status can hold the log to."""
    return {"seq": sealed.seq, "hash": sealed.hash}


def _facts(body: Body, view: DeviceView | None) -> tuple[IntentFacts, DeviceFacts]:
    meta, spec = body["metadata"], body["spec"]
    facts = IntentFacts(
        uid=meta["uid"],
        name=meta["name"],
        device=spec["device"],
        actuator=spec["actuator"],
        action=spec["action"],
        value=(spec.get("params") or {}).get("value"),  # none for a read
        requester=spec["requester"],
        created_at=_parse_time(meta["creationTimestamp"]),
        based_on=tuple(Observation(o["metric"], o["ts"], o.get("deviceId")) for o in spec.get("basedOn") or []),
        cancelled=(meta.get("annotations") or {}).get(CANCEL_ANNOTATION),
        holder_id=spec.get("holderId"),
        dry_run=bool(spec.get("dryRun")),
    )
    device = DeviceFacts(
        exists=view is not None and view.exists,
        device_id=view.device_id if view is not None else None,
        contract=view.contract if view is not None else None,
        online=view.online if view is not None else None,
        present=view is not None,
        labels=((view.body.get("metadata") or {}).get("labels") or {}) if view is not None else {},
    )
    return facts, device


def _doing(spec: dict[str, Any], decision: Decision) -> str:
    if spec["action"] == "read":
        return f"read {spec['actuator']} from the device"
    if spec["action"] in OVERLAY_ACTIONS:
        return f"set the {OVERLAY_ACTIONS[spec['action']]} of {spec['device']} to {shown(decision.value)}"
    return f"{spec['action']} {spec['actuator']}={shown(decision.value)} on {spec['device']}"


def _checked_value(view: DeviceView | None, spec: dict[str, Any]) -> Any:
    """The Intent's value in its canonical type for the device's contract, or None if it no longer fits."""
    contract = view.contract if view is not None else None
    actuator = contract.actuator(spec["actuator"]) if contract is not None else None
    if actuator is None or actuator.action != spec.get("action"):
        return None
    try:
        return check(actuator, (spec.get("params") or {}).get("value"))
    except InvalidValue:
        return None


def _status_of(body: Body) -> IntentStatus:
    try:
        return IntentStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return IntentStatus()


def _name(body: Body) -> str:
    return f"{body['metadata']['namespace']}/{body['metadata']['name']}"


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text)
