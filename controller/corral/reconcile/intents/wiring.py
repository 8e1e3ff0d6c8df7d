"""The Intent controller, wired: its caches, its two reconcilers, and which watch events queue which keys.

As controller-runtime's builder declares a controller (`For`, `Watches` with a map from an event to keys),
this module says what each watched kind does, and the reconcilers only ever see keys:

- For(Intent): the Intent's own key, once its body entered the cache (and was readable);
- Watches(Approval): the key of the Intent it decides on;
- Watches(ApprovalGrant): every Intent of its namespace that waits for a person, when a grant appears;
- Watches(AgentPause): every undecided Intent of its namespace, when agents are paused or resumed.

Bodies become models here, once (`kube.cache.TypedCache`); everything past this point reads typed objects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from corral.api.approval import Approval
from corral.api.codes import FINAL_PHASES
from corral.audit.decisions import DecisionIndex
from corral.audit.log import AuditLog
from corral.audit.requests import RequestNames
from corral.kube.access import AccessReviews
from corral.kube.cache import Key, TypedCache, key_of
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.kube.typed import Body, Malformed, parse
from corral.kube.workqueue import WorkQueue
from corral.obs import tracing
from corral.reconcile.devices.port import DevicePort
from corral.reconcile.guards.interlocks import Interlocks
from corral.reconcile.guards.leases import Leases
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.intents.actuate import Actuate
from corral.reconcile.intents.dispatch import Dispatch
from corral.reconcile.intents.effects import Effects
from corral.reconcile.intents.execute import ExecutionReconciler, Handovers
from corral.reconcile.intents.facts import StoredIntent, name_of, status_of, uid_of, value_of
from corral.reconcile.intents.gather import Gatherer
from corral.reconcile.intents.grants import Grants
from corral.reconcile.intents.holds import HoldReverts
from corral.reconcile.intents.kinds import Kinds
from corral.reconcile.intents.lease import Lease
from corral.reconcile.intents.malformed import MalformedIntents, meta_of
from corral.reconcile.intents.outcomes import Outcomes
from corral.reconcile.intents.overlay import Overlay
from corral.reconcile.intents.ratelimits import RequestIndex
from corral.reconcile.intents.read import Read
from corral.reconcile.intents.reconciler import IntentReconciler
from corral.reconcile.intents.replays import Replays
from corral.reconcile.intents.settings import IntentSettings

log = logging.getLogger(__name__)


class IntentController:
    """The Intent side of the controller: caches, queues, the two reconcilers, and the watches that feed them."""

    def __init__(self, settings: IntentSettings, kube: Kube, access: AccessReviews, recorder: EventRecorder,
                 devices: DevicePort, audit: AuditLog, recorded: DecisionIndex,
                 interlocks: Interlocks | None = None, on_awaiting: Callable[[Body], None] | None = None,
                 grants: Grants | None = None, leases: Leases | None = None,
                 pauses: AgentPauses | None = None, names: RequestNames | None = None) -> None:
        self.settings = settings
        self.devices = devices
        self.recorded = recorded
        # By namespace/name, for the idempotency window: the decisions of Intents deleted since (audit.requests).
        self.names = names if names is not None else RequestNames()
        self.intents: TypedCache[StoredIntent] = TypedCache(StoredIntent)
        self.approvals: TypedCache[Approval] = TypedCache(Approval)
        self.grants = grants if grants is not None else Grants(kube, access)
        # Each requester's Intents, for its rate limit (counted from the Intents themselves, so a restart agrees).
        self.requests = RequestIndex(settings.policy.rate_limit, self.intents.get)
        self.traces = tracing.FirstTraces()  # the trace each Intent was created in: read once, at creation
        self.decisions: WorkQueue[Key] = WorkQueue("intents")
        self.outcomes = Outcomes(settings, kube, recorder, audit, self.intents, self.approvals, self.traces)
        self.malformed = MalformedIntents(kube, recorder)
        effects = Effects(kube, recorder, audit, self.outcomes, self.grants, self.approvals, leases)
        handovers = Handovers()
        kinds = Kinds(Actuate(handovers), Read(self.outcomes, devices), Overlay(self.outcomes, kube),
                      Lease(self.outcomes, leases, audit))
        gatherer = Gatherer(settings.policy, access, devices, self.approvals, self.grants, self.requests, kinds,
                            interlocks, leases, pauses)
        reverts = HoldReverts(settings, kube, devices, self.intents, self.outcomes, gatherer)
        self.executor = ExecutionReconciler(settings, handovers, self.intents, devices, self.outcomes, gatherer,
                                            effects, audit, self.decisions, reverts)
        self.reconciler = IntentReconciler(self.intents, devices, audit, recorded, self.outcomes, gatherer, effects,
                                           Dispatch(self.outcomes, kinds, on_awaiting), handovers, self.malformed,
                                           Replays(self.names, self.outcomes), reverts)

    @property
    def executions(self) -> WorkQueue[Key]:
        return self.executor.handovers.queue

    # ---- watches: events in, keys out -----------------------------------------------------------------------

    def on_intent_event(self, event_type: str, body: Body) -> None:
        """For(Intent)."""
        key = key_of(body)
        if event_type == "DELETED":
            self._forget(key, body)
            return
        try:
            change = self.intents.upsert(body)
        except Malformed as problem:
            self.malformed.note(key, body, problem)
            self.outcomes.track(key, None)
            self.decisions.add(key)
            return
        self.malformed.forget(key)
        seen = change.after if change is not None else self.intents.get(key)  # an older copy: the same request
        if seen is not None:
            self.requests.observe(event_type, seen)
        if change is not None:
            self.outcomes.track(key, change.after)
            self.decisions.add(key)

    def on_approval_event(self, event_type: str, body: Body) -> None:
        """Watches(Approval): the Intent it decides on."""
        if event_type == "DELETED":
            self.approvals.remove(body)
            return
        try:
            change = self.approvals.upsert(body)
        except Malformed as problem:
            log.warning("%s; it counts for no Intent", problem)
            return
        if change is not None:
            self.decisions.add((change.key[0], change.after.spec.intent.name))

    def on_grant_event(self, event_type: str, body: Body) -> None:
        """Watches(ApprovalGrant): a new grant may cover what waits in its namespace."""
        if self.grants.on_event(event_type, body):
            for key in self.outcomes.awaiting(key_of(body)[0]):
                self.decisions.add(key)

    def on_pause_change(self, namespace: str) -> None:
        """Watches(AgentPause): agents were paused or resumed there, so what is not decided yet is decided again
        (a pause ends it)."""
        for key, intent in self.intents.items():
            if key[0] == namespace and status_of(intent).phase not in FINAL_PHASES:
                self.decisions.add(key)

    def prime(self, intents: list[Body]) -> None:
        """Before the device side starts: Intents that were executing when the controller stopped pin their
        command again, so that the device reconciler sends nothing for that actuator until the resumed
        execution has re-applied its target, and then sends it with the Intent's own command id. The audit
        log says which were executing: their status shows it only if the execution outlasted its delay."""
        for body in intents:
            self.on_intent_event("ADDED", body)
            key = key_of(body)
            intent = self.intents.get(key)
            status = status_of(intent) if intent is not None else None
            if intent is None or status is None or status.phase in FINAL_PHASES:
                continue
            if uid_of(intent) in self.recorded.decided:
                continue  # a decision on record is restored, never resumed: a pin would hold the actuator for nobody
            recorded = self.recorded.executing.get(uid_of(intent))
            command_id = recorded.data.get("commandId") if recorded is not None else status.command_id
            if not command_id or (recorded is None and status.phase != "Executing"):
                continue
            view = self.devices.view(key[0], intent.spec.device)
            if view is not None and view.device_id:
                self.devices.pin(view.device_id, intent.spec.actuator, value_of(intent), command_id,
                                 name_of(intent), None)

    def _forget(self, key: Key, body: Body) -> None:
        """A deleted Intent: out of the caches, and a primed pin nobody will resume released."""
        cached = self.intents.remove(body)
        self.malformed.forget(key)
        try:
            gone: StoredIntent | None = parse(StoredIntent, body)
        except Malformed:
            gone = cached
        if gone is not None:
            self.requests.observe("DELETED", gone)
        uid = meta_of(body).uid or ""
        self.traces.forget(uid)
        self.outcomes.track(key, None)
        self.recorded.forget(uid)
        command_id = status_of(gone).command_id if gone is not None else None
        view = self.devices.view(key[0], gone.spec.device) if gone is not None else None
        if command_id and view is not None and view.device_id:
            self.devices.release_command(view.device_id, command_id)

