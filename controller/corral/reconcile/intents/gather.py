"""Gather: every fact the pure decision reads about one Intent, collected before it is made.

`decide` (corral.decide) is pure: it is handed the Intent and Device facts, whether the requester may, the
approvals and standing grants that name the Intent, the guards around the Device (contract hold, interlocks,
lease, pause), the cited readings and the rate-limit verdict, and returns a `Decision`. Everything that asks the
API server (access reviews, grantors' rights) or reads the controller's state happens here, first; then
`Gathered.judge` decides, with nothing left to look up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from corral.api.approval import Approval
from corral.decide.approvals import ApprovalView
from corral.decide.decision import (
    Decision,
    DeviceFacts,
    Guards,
    IntentFacts,
    Policy,
    RuleOrigin,
    decide,
)
from corral.decide.decision import recheck as judge_again
from corral.decide.evidence import Evidence
from corral.decide.grants import GrantView
from corral.decide.idempotency import params_hash
from corral.decide.ratelimit import Limited
from corral.kube.access import AccessReviews
from corral.kube.cache import TypedCache
from corral.reconcile.devices.port import DevicePort, DeviceView
from corral.reconcile.guards.interlocks import Interlocks
from corral.reconcile.guards.leases import Leases
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.intents.facts import (
    StoredIntent,
    checked_value,
    device_labels,
    facts_of,
    namespace_of,
    spec_body,
    value_of,
)
from corral.reconcile.intents.grants import Grants
from corral.reconcile.intents.kinds import Kinds
from corral.reconcile.intents.ratelimits import RequestIndex


@dataclass(frozen=True)
class Gathered:
    """What the decision about one Intent reads, as it was when gathered."""

    facts: IntentFacts
    device: DeviceFacts
    requester_may: bool
    approvals: list[ApprovalView]
    digest: str  # the params hash approvals bind to
    now: datetime
    policy: Policy
    guards: Guards
    evidence: Evidence
    grants: list[GrantView]
    limited: Limited | None

    def judge(self) -> Decision:
        """The pure decision on these facts."""
        return decide(self.facts, self.device, self.requester_may, self.approvals, self.digest, self.now,
                      self.policy, self.guards, self.evidence, self.grants, self.limited)


class Gatherer:
    """Collects an Intent's facts from the caches, the guards and the API server's access reviews."""

    def __init__(self, policy: Policy, access: AccessReviews, devices: DevicePort, approvals: TypedCache[Approval],
                 grants: Grants, requests: RequestIndex, kinds: Kinds, interlocks: Interlocks | None,
                 leases: Leases | None, pauses: AgentPauses | None) -> None:
        self.policy = policy
        self.access = access
        self.devices = devices
        self.approvals = approvals
        self.grants = grants
        self.requests = requests
        self.kinds = kinds
        self.interlocks = interlocks  # the cross-device rules (None: none are watched)
        self.leases = leases  # exclusive control of Devices (None: no Lease objects are watched, none hold)
        self.pauses = pauses  # the agents kill switch of each namespace (None: agents are never paused)
        # The Rule that made an Intent, verified by the Rule controller (never a label alone); None: no Rule did.
        self.origin_of: Callable[[StoredIntent], RuleOrigin | None] = lambda intent: None

    async def gather(self, intent: StoredIntent, view: DeviceView | None) -> Gathered:
        """The facts for deciding the Intent."""
        namespace, labels = namespace_of(intent), device_labels(view)
        facts, device = facts_of(intent, view, labels)
        facts = replace(facts, rule=self.origin_of(intent))
        requester_may = await self.requester_may(facts, device, namespace, intent.spec.requester_groups)
        approvals = await self.approvals_for(intent, facts.device)
        digest = params_hash(namespace, spec_body(intent))
        now = datetime.now(UTC)
        grants = await self.grants_for(intent, view, labels, now)
        limited = self.requests.verdict(intent)
        return Gathered(facts, device, requester_may, approvals, digest, now, self.policy, self.guards(intent, view),
                        self.evidence(facts, device), grants, limited)

    def without_grant(self, gathered: Gathered, grant: str, intent: StoredIntent,
                      view: DeviceView | None) -> Gathered:
        """The facts again after a grant was found used up or revoked: the guards and readings as they are now,
        the other grants."""
        return replace(gathered, grants=[g for g in gathered.grants if g.name != grant],
                       guards=self.guards(intent, view), evidence=self.evidence(gathered.facts, gathered.device))

    async def recheck(self, intent: StoredIntent, view: DeviceView) -> Decision | None:
        """Scope, pause, hold, interlocks and lease, once more: an approval may have taken minutes."""
        facts, device = facts_of(intent, view, device_labels(view))
        facts = replace(facts, rule=self.origin_of(intent))
        requester_may = await self.requester_may(facts, device, namespace_of(intent), intent.spec.requester_groups)
        return judge_again(facts, device, requester_may, datetime.now(UTC), self.guards(intent, view), self.policy)

    async def requester_may(self, facts: IntentFacts, device: DeviceFacts, namespace: str,
                            groups: list[str] | None) -> bool:
        verb = self.kinds.of(facts.action).verb(facts, device)
        if verb is None:
            return False
        return await self.access.may(facts.requester, verb, namespace, facts.device, groups)

    async def approvals_for(self, intent: StoredIntent, device: str) -> list[ApprovalView]:
        namespace, name = namespace_of(intent), intent.metadata.name
        views = []
        for (ns, _), approval in sorted(self.approvals.items(), key=lambda item: item[0]):
            spec = approval.spec
            if ns != namespace or spec.intent.name != name:
                continue
            created = approval.metadata.creation_timestamp
            assert created is not None, "the API server sets creationTimestamp"
            views.append(ApprovalView(
                name=approval.metadata.name or "",
                intent_uid=spec.intent.uid,
                params_hash=spec.params_hash,
                decision=spec.decision,
                approver=spec.approver,
                approver_may_approve=await self.access.may(spec.approver, "approve", namespace, device,
                                                           spec.approver_groups),
                created_at=created,
                expires_at=spec.expires_at,
                consumed=bool(approval.status is not None and approval.status.consumed),
                reason=spec.reason or "",
            ))
        return views

    async def grants_for(self, intent: StoredIntent, view: DeviceView | None, labels: dict[str, str],
                         now: datetime) -> list[GrantView]:
        """The standing grants that would let this Intent run without a per-request approval."""
        spec = intent.spec
        contract = view.contract if view is not None else None
        actuator = contract.actuator(spec.actuator) if contract is not None else None
        value = checked_value(view, intent)
        if view is None or actuator is None or value is None:
            return []
        return await self.grants.covering(namespace_of(intent), spec.requester, spec.device, labels, actuator.id,
                                          value, actuator.risk, now, self.policy.people)

    def guards(self, intent: StoredIntent, view: DeviceView | None) -> Guards:
        """The safety envelope around the Intent's device now: its contract hold and the interlocks that guard this
        action, judged now, its lease, and whether agents are paused in its namespace. Reads, overlay text and
        leases set no target: no interlock guards them."""
        namespace, spec = namespace_of(intent), intent.spec
        hold = view.hold if view is not None else None
        paused = self.pauses.paused(namespace) if self.pauses is not None else None
        rules_paused = self.pauses.rules_paused(namespace) if self.pauses is not None else None
        lease, broken = self.leases.guard(namespace, spec.device) if self.leases is not None else (None, None)
        if self.interlocks is None or view is None or not self.kinds.of(spec.action).interlocked:
            return Guards(hold=hold, lease=lease, broken=broken, paused=paused, rules_paused=rules_paused)
        checked = checked_value(view, intent)
        value = checked if checked is not None else value_of(intent)
        verdicts = self.interlocks.verdicts(namespace, view.body, spec.actuator, value, self.devices.view)
        return Guards(hold=hold, interlocks=verdicts, lease=lease, broken=broken, paused=paused,
                      rules_paused=rules_paused)

    def evidence(self, facts: IntentFacts, device: DeviceFacts) -> Evidence:
        own = device.device_id or ""
        return self.devices.evidence((o.device_id or own, o.metric, o.ts_ms) for o in facts.based_on)
