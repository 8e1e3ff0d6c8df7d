"""How a decision about an Intent becomes visible: the audit record first, then the status, then an Event.

Every part of the Intent controller (the decision, each kind's action, the execution) ends an Intent the same
way, through `Outcomes.finish`: the outcome is sealed in the audit log (fsynced), then written to the status
with the record's citation, then announced in metrics and an Event. Status writes go through `Kube.apply_status`
as `corral-controller` with the whole status merged, and the answer goes into the Intent cache, so the next
reconcile reads its own write. Apart from the pipeline because every step of it needs these, and none of them
needs the pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from corral.api.approval import Approval
from corral.api.base import Condition
from corral.api.codes import DecisionCode, event_reason, phase_of
from corral.api.intent import IntentStatus
from corral.audit.chain import AuditRecord, line_hash
from corral.audit.decisions import DECIDED
from corral.audit.log import AuditLog, Sealed
from corral.audit.requests import IDENTITY
from corral.decide.idempotency import identity_hash
from corral.kube.cache import Key, TypedCache, key_of
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.objects import Kube
from corral.kube.typed import Body, parse
from corral.kube.workqueue import Result
from corral.obs import metrics, tracing
from corral.obs.crashpoints import DECIDED_RECORDED, FINAL_WRITTEN, crash_point
from corral.reconcile.devices.notices import device_ref
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.doors import OPEN, Doors
from corral.reconcile.intents.facts import (
    StoredIntent,
    created_at,
    name_of,
    namespace_of,
    ref_of,
    spec_body,
    status_of,
    trace_source,
    uid_of,
)
from corral.reconcile.intents.settings import (
    AUDIT_CONDITION,
    AUDIT_RECHECK_S,
    DRY_RUN_TTL,
    MESSAGE_LIMIT,
    IntentSettings,
)

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]


def cited(sealed: Sealed) -> dict[str, Any]:
    """status.audit: the decision record a client that sees this status can hold the log to."""
    return {"seq": sealed.seq, "hash": sealed.hash}


class Outcomes:
    doors: Doors = OPEN  # the controller's, set where it is wired: only the owner of its device writes an Intent

    """Writes an Intent's status and Events, and seals its decisions in the audit log."""

    def __init__(self, settings: IntentSettings, kube: Kube, recorder: EventRecorder, audit: AuditLog,
                 intents: TypedCache[StoredIntent], approvals: TypedCache[Approval],
                 traces: tracing.FirstTraces) -> None:
        self.settings = settings
        self.kube = kube
        self.recorder = recorder
        self.audit = audit
        self.intents = intents
        self.approvals = approvals
        self.traces = traces
        self._awaiting: set[Key] = set()  # for the approvals-waiting gauge

    def track(self, key: Key, intent: StoredIntent | None) -> None:
        if intent is not None and status_of(intent).phase == "AwaitingApproval":
            self._awaiting.add(key)
        else:
            self._awaiting.discard(key)
        metrics.APPROVALS_WAITING.set(len(self._awaiting))

    def awaiting(self, namespace: str) -> list[Key]:
        """The Intents of the namespace that wait for a person, in order."""
        return [key for key in sorted(self._awaiting) if key[0] == namespace]

    # ---- the status -----------------------------------------------------------------------------------------

    async def write(self, intent: StoredIntent, updates: dict[str, Any], reason: str) -> StoredIntent:
        """Apply the Intent's status with these fields changed; the Intent as the API server now has it."""
        return (await self.write_answer(intent, updates, reason))[0]

    async def write_answer(self, intent: StoredIntent, updates: dict[str, Any],
                           reason: str) -> tuple[StoredIntent, Body]:
        """As `write`, with the API server's answer as it came (for those who pass the object on)."""
        meta = intent.metadata
        if isinstance(updates.get("message"), str):
            updates = {**updates, "message": updates["message"][:MESSAGE_LIMIT]}
        current = status_of(intent)
        if "conditions" not in updates and any(c.type == AUDIT_CONDITION and c.status == "False"
                                                for c in current.conditions):
            # It waited for the audit log; whatever is written now was recorded first.
            updates = {**updates, "conditions": [
                c if c.type != AUDIT_CONDITION else c.model_copy(update={
                    "status": "True", "reason": "AuditLogWritable", "message": "The audit log can be written again.",
                    "last_transition_time": datetime.now(UTC).replace(microsecond=0)})
                for c in current.conditions]}
        merged = {**current.model_dump(by_alias=False), **updates, "observed_generation": meta.generation}
        status = IntentStatus.model_validate(merged)
        self.doors.check_intent(namespace_of(intent), intent.spec.device, "writing Intent status")
        await self.doors.label("intents", meta, self.doors.device_id(namespace_of(intent), intent.spec.device))
        written = await self.kube.apply_status("intents", namespace_of(intent), meta.name or "", "Intent",
                                               status.model_dump(mode="json", by_alias=True, exclude_none=True), reason)
        change = self.intents.upsert(written)
        now = change.after if change is not None else parse(StoredIntent, written)
        self.track(key_of(written), now)
        return now, written

    def event(self, intent: StoredIntent, reason: str, action: str, note: str, type_: EventType = "Normal",
              related: ObjectRef | None = None) -> None:
        self.recorder.post(ref_of(intent), reason, action, note, type_, related)

    async def record(self, kind: str, intent: StoredIntent, data: dict[str, Any]) -> Sealed:
        """On disk before anything reveals it; Unwritable when it cannot be. Where it landed, to cite."""
        spec, asked = intent.spec, spec_body(intent)
        # A hold is part of what was asked and decided: what is put back, and when.
        held: dict[str, Any] = {key: asked[key] for key in ("holdFor", "then") if key in asked}
        facts = {"device": spec.device, "action": spec.action, "actuator": spec.actuator,
                 "params": asked.get("params"), "requester": spec.requester, "reason": spec.reason,
                 "basedOn": asked.get("basedOn") or [], **held, **data}
        if kind == DECIDED:  # what a replay of this name is compared with once the Intent is gone (audit.requests)
            facts[IDENTITY] = identity_hash(asked)
        return await self.audit.seal(kind, name_of(intent), facts, uid=uid_of(intent),
                                     trace=tracing.trace_id_of(self.traces.of(trace_source(intent))))

    # ---- final outcomes -------------------------------------------------------------------------------------

    async def finish(self, intent: StoredIntent, view: DeviceView | None, code: DecisionCode, message: str,
                     extra: dict[str, Any], noted: dict[str, Any] | None = None) -> Result:
        """The Intent's final code: sealed in the audit log, then written to its status, then announced.
        `noted`: more fields for the record only."""
        status = {**{k: v for k, v in extra.items() if v is not None}, "phase": phase_of(code), "code": code,
                  "message": message[:MESSAGE_LIMIT], "decided_at": datetime.now(UTC).replace(microsecond=0)}
        previous = status_of(intent)
        approvals = [n for n in (previous.approval or "").split(",") if n]
        sealed = await self.record(DECIDED, intent, {
            "code": code, "message": status["message"], "before": status.get("before", previous.before),
            "after": status.get("after"), "risk": status.get("risk", previous.risk),
            "level": status.get("level", previous.level),
            "paramsHash": status.get("params_hash", previous.params_hash),
            "approval": previous.approval, "commandId": previous.command_id,
            **({"deviceError": status["device_error"]} if "device_error" in status else {}),
            "approvers": self.approvers(namespace_of(intent), approvals), **(noted or {})})
        status["audit"] = cited(sealed)  # with the final status write, not one of its own
        crash_point(DECIDED_RECORDED)
        written = await self.write(intent, status, "final")
        crash_point(FINAL_WRITTEN)
        return await self.announce(written, view, code, message)

    async def announce(self, intent: StoredIntent, view: DeviceView | None, code: DecisionCode,
                       message: str) -> Result:
        metrics.INTENTS.labels(code=code).inc()
        metrics.INTENT_SECONDS.observe(max(0.0, (datetime.now(UTC) - created_at(intent)).total_seconds()))
        kind: EventType = "Normal" if code == "EXECUTED" else "Warning"
        related = device_ref(view.body) if view is not None else None
        self.event(intent, event_reason(code), "Decide",
                   f"{code}: {message} (requested by {intent.spec.requester})", kind, related)
        return Result.after(self.kept_for(intent).total_seconds())

    async def restore(self, intent: StoredIntent, view: DeviceView | None, recorded: AuditRecord) -> Result:
        """The outcome the log holds, written to a status that does not show it yet (never decided again)."""
        data = recorded.data
        audit = cited(Sealed(recorded.seq, line_hash(recorded)))
        if data.get("dryRun"):
            await self.write(intent, {"phase": "DryRun", "code": data.get("code"), "would": data.get("would"),
                                      "message": data["message"], "decided_at": recorded.at.replace(microsecond=0),
                                      "audit": audit}, "restored")
            return Result.after(DRY_RUN_TTL.total_seconds())
        status = {"phase": phase_of(data["code"]), "code": data["code"], "message": data["message"],
                  "before": data.get("before"), "after": data.get("after"), "risk": data.get("risk"),
                  "level": data.get("level"), "params_hash": data.get("paramsHash"),
                  "command_id": data.get("commandId"), "device_error": data.get("deviceError"),
                  "hold": data.get("hold"), "decided_at": recorded.at.replace(microsecond=0), "audit": audit}
        log.info("Intent %s: its decision (audit seq %d) is restored from the audit log", name_of(intent),
                 recorded.seq)
        written = await self.write(intent, {k: v for k, v in status.items() if v is not None}, "restored")
        return await self.announce(written, view, data["code"], data["message"])

    def approvers(self, namespace: str, approvals: Sequence[str]) -> list[str]:
        found = [self.approvals.get((namespace, name)) for name in approvals]
        return [approval.spec.approver if approval is not None else "?" for approval in found]

    # ---- waiting and housekeeping ---------------------------------------------------------------------------

    async def wait_for_audit(self, key: Key) -> Result:
        """Undecided while the log cannot be written; the condition says why (written once, not every retry)."""
        intent = self.intents.get(key)
        if intent is None:
            return Result.done()
        status = status_of(intent)
        if not any(c.type == AUDIT_CONDITION and c.status == "False" for c in status.conditions):
            message = (f"Waiting: the audit log cannot be written ({self.audit.error or 'unknown error'}). Corral "
                       "decides nothing it cannot record; this Intent is decided as soon as the log can be written.")
            condition = Condition(type=AUDIT_CONDITION, status="False", reason="AuditLogUnwritable", message=message,
                                  last_transition_time=datetime.now(UTC).replace(microsecond=0),
                                  observed_generation=intent.metadata.generation)
            phase = status.phase or "Pending"
            updates: dict[str, Any] = {"phase": phase, "conditions": [condition]}
            if phase == "Pending":
                updates["message"] = message
            try:
                await self.write(intent, updates, "audit-unwritable")
            except ApiError as err:
                log.warning("could not say on Intent %s that it waits for the audit log: %s", name_of(intent), err)
        return Result.after(AUDIT_RECHECK_S)

    def kept_for(self, intent: StoredIntent) -> timedelta:
        """How long a decided Intent is kept: `--intent-retention`, a dry run's ten minutes."""
        return DRY_RUN_TTL if intent.spec.dry_run else self.settings.retention

    async def housekeep(self, intent: StoredIntent) -> Result:
        """A decided Intent is deleted when its retention is over (`--intent-retention`, an hour; a dry run's, ten
        minutes), counted from the end of its timed hold if it had one (one still Pending never gets here). Its records stay in the audit log, where a replay of its name is still answered from
        (audit.requests)."""
        status = status_of(intent)
        decided = status.decided_at
        if decided is None:
            return Result.done()
        if status.hold is not None and status.hold.ended_at is not None:
            decided = max(decided, status.hold.ended_at)  # kept as long after its hold ended as after a decision
        age = datetime.now(UTC) - decided
        ttl = self.kept_for(intent)
        if age < ttl:
            return Result.after((ttl - age).total_seconds())
        await self.kube.delete_intent(namespace_of(intent), intent.metadata.name or "", uid_of(intent))
        return Result.done()

