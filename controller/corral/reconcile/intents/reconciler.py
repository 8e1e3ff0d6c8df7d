"""The Intent reconciler: one entry point, `reconcile(key)`, on the Intent queue.

An Intent moves Pending -> (AwaitingApproval ->) Executing -> Succeeded, or ends Denied/Failed with one code.
`reconcile` first settles what is on record (a final Intent is only kept until its time is up, and until its
timed hold ran out, holds.py; one the audit
log holds a decision for gets that decision; one recorded as executing is resumed; one that replays a name used
within the idempotency window, by an Intent since deleted, is answered DEDUP or DENY_ID_CONFLICT from the audit
log, replays.py), then runs the pipeline:

    gather (gather.py) -> decide (corral.decide, pure) -> effects (effects.py) -> dispatch (dispatch.py)

The decision is made on gathered facts and does nothing; what it returned is then carried out: the grant it
names is spent (decided again without it when none is left), approvals that do not count are marked so, the
requester's lease is renewed, and the outcome is dispatched to the Intent's kind. Executing an actuating Intent
is the second reconciler's (execute.py), on a queue per Device.

Every decision is in the audit log, fsynced, before the status write that reveals it: the decision to execute
(`intent.executing`, with the command id) and the outcome (`intent.decided`). An Intent whose status does not
show what the log holds (the controller died between the two writes) gets the recorded outcome, or resumes the
recorded execution; it is not judged again. While the log cannot be written no Intent is decided: each waits,
Pending, with a condition that says why.
"""

from __future__ import annotations

from corral.api.codes import FINAL_PHASES
from corral.audit.chain import AuditRecord
from corral.audit.decisions import DecisionIndex
from corral.audit.log import AuditLog, Unwritable
from corral.decide.decision import Decision
from corral.kube.cache import Key, TypedCache
from corral.kube.workqueue import Result
from corral.obs import tracing
from corral.reconcile.devices.port import DevicePort, DeviceView
from corral.reconcile.intents.dispatch import Dispatch
from corral.reconcile.intents.effects import Effects
from corral.reconcile.intents.execute import Handovers
from corral.reconcile.intents.facts import StoredIntent, name_of, status_of, trace_source, uid_of
from corral.reconcile.intents.gather import Gathered, Gatherer
from corral.reconcile.intents.holds import HoldReverts, pending
from corral.reconcile.intents.malformed import MalformedIntents
from corral.reconcile.intents.outcomes import Outcomes
from corral.reconcile.intents.replays import Replays
from corral.reconcile.intents.settings import IntentSettings as IntentSettings  # where the command line finds it

__all__ = ["IntentReconciler", "IntentSettings"]


class IntentReconciler:
    """Decides each Intent once, and acts on the decision."""

    def __init__(self, intents: TypedCache[StoredIntent], devices: DevicePort, audit: AuditLog,
                 recorded: DecisionIndex, outcomes: Outcomes, gatherer: Gatherer, effects: Effects,
                 dispatch: Dispatch, handovers: Handovers, malformed: MalformedIntents, replays: Replays,
                 reverts: HoldReverts) -> None:
        self.intents = intents
        self.devices = devices
        self.audit = audit
        self.recorded = recorded  # what the log says was decided, by Intent UID
        self.outcomes = outcomes
        self.gatherer = gatherer
        self.effects = effects
        self.dispatch = dispatch
        self.handovers = handovers
        self.malformed = malformed
        self.replays = replays  # a name used within the idempotency window, by an Intent since deleted
        self.reverts = reverts  # timed holds (holds.py)

    async def reconcile(self, key: Key) -> Result:
        intent = self.intents.get(key)
        if intent is None:
            return await self.malformed.tell(key)
        # Joins the trace of whoever created the Intent (the gateway's tool call), if it carries one.
        with tracing.tracer().start_as_current_span(
                "corral.intent.decide", context=tracing.context_of(self.outcomes.traces.of(trace_source(intent))),
                attributes={"corral.intent": name_of(intent)}):
            try:
                return await self._reconcile(key, intent)
            except Unwritable:
                return await self.outcomes.wait_for_audit(key)

    async def _reconcile(self, key: Key, intent: StoredIntent) -> Result:
        phase = status_of(intent).phase
        if phase in FINAL_PHASES and pending(intent):
            # A timed hold: kept (never housekept) until it runs out, then put back on its Device's queue.
            waiting = self.reverts.due(intent)
            if waiting is None:
                self.handovers.hand_over(key, intent, None, revert=True)
                return Result.done()
            return waiting
        if phase in FINAL_PHASES:
            return await self.outcomes.housekeep(intent)
        if self.handovers.handed_over(key, intent):
            return Result.done()
        view = self.devices.view(key[0], intent.spec.device)
        if view is not None and not view.exists and self.devices.still_listening():
            # Just (re)started: the device may announce itself in a moment; do not call it gone yet.
            return Result.after(1.0)
        recorded = self.recorded.decided.get(uid_of(intent))
        if recorded is not None:
            return await self.outcomes.restore(intent, view, recorded)
        if not self.audit.writable and not await self.audit.recovered():
            return await self.outcomes.wait_for_audit(key)
        executing = self.recorded.executing.get(uid_of(intent))
        if phase != "Executing" and executing is not None:
            # Decided to execute, on record, but the controller stopped before status said so: carry on.
            intent = await self._executing_restored(intent, executing)
        elif phase != "Executing":
            replayed = await self.replays.answer(intent, view)
            return replayed if replayed is not None else await self._decide(key, intent, view)
        self.handovers.hand_over(key, intent, None)  # resumed after a restart: carried on, never decided again
        return Result.done()

    async def _executing_restored(self, intent: StoredIntent, executing: AuditRecord) -> StoredIntent:
        data = executing.data
        return await self.outcomes.write(intent, {"phase": "Executing", "message": data.get("message", ""),
                                                  "before": data.get("before"), "approval": data.get("approval"),
                                                  "command_id": data["commandId"]}, "executing-restored")

    async def _decide(self, key: Key, intent: StoredIntent, view: DeviceView | None) -> Result:
        gathered = await self.gatherer.gather(intent, view)
        decision = await self._settled(intent, view, gathered)
        return await self.dispatch.act(key, intent, view, decision, gathered.now, gathered.digest)

    async def _settled(self, intent: StoredIntent, view: DeviceView | None, gathered: Gathered) -> Decision:
        """The pure decision, and then its effects on other objects. A grant it names that has no use left by
        the time it is spent is dropped, and the Intent decided again on the remaining ones."""
        decision = gathered.judge()
        while (decision.grant is not None and not intent.spec.dry_run
               and not await self.effects.spend(intent, decision.grant)):
            gathered = self.gatherer.without_grant(gathered, decision.grant, intent, view)
            decision = gathered.judge()
        await self.effects.refuse(intent, decision.refused)
        await self.effects.renew(intent, gathered.facts)
        return decision
