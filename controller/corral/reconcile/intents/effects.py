"""What a decision does to other objects, done after it was made and from what it returned.

`decide` names a standing grant to spend, approvals that do not count, and (by the Intent's action) whether
the requester's lease is renewed; the execution names the approvals it used. None of that is done while
deciding: the reconciler decides, then asks this module to carry it out. Spending a grant can fail (someone
used the last use meanwhile, or it was revoked); the reconciler then decides again without it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from corral.api.approval import Approval, ApprovalStatus
from corral.api.codes import API_VERSION
from corral.audit.log import AuditLog
from corral.decide.approvals import Refusal
from corral.decide.decision import IntentFacts
from corral.kube.cache import TypedCache
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.objects import Kube
from corral.kube.typed import Malformed
from corral.reconcile.guards.leases import Leases
from corral.reconcile.intents.facts import StoredIntent, name_of, namespace_of, ref_of, uid_of
from corral.reconcile.intents.grants import Grants
from corral.reconcile.intents.outcomes import Outcomes
from corral.reconcile.intents.settings import MESSAGE_LIMIT

log = logging.getLogger(__name__)


class Effects:
    """Grants spent, approvals refused or used, leases renewed: each on record and told in an Event."""

    def __init__(self, kube: Kube, recorder: EventRecorder, audit: AuditLog, outcomes: Outcomes, grants: Grants,
                 approvals: TypedCache[Approval], leases: Leases | None) -> None:
        self.kube = kube
        self.recorder = recorder
        self.audit = audit
        self.outcomes = outcomes
        self.grants = grants
        self.approvals = approvals
        self.leases = leases

    async def spend(self, intent: StoredIntent, grant: str) -> bool:
        """One use of the grant for this Intent, atomically and on record; False when none was left."""
        namespace = namespace_of(intent)
        spent = await self.grants.consume(namespace, grant, intent.metadata.name or "", uid_of(intent))
        if spent is None:
            return False
        self.audit.note("grant.used", f"{namespace}/{grant}", {
            "intent": name_of(intent), "intentUid": uid_of(intent), "grantor": spent.grantor, "use": spent.use,
            "uses": spent.uses, "requester": intent.spec.requester})
        self.outcomes.event(intent, "GrantUsed", "Decide", f"Runs under ApprovalGrant {grant} of {spent.grantor}: "
                                                           f"use {spent.use} of {spent.uses}.")
        return True

    async def refuse(self, intent: StoredIntent, refused: Sequence[Refusal]) -> None:
        """Approvals that do not count say so on their own status (once), on record and in an Event; the Intent
        they were for keeps waiting."""
        namespace = namespace_of(intent)
        for refusal in refused:
            approval = self.approvals.get((namespace, refusal.approval))
            if approval is None or (approval.status is not None and approval.status.refused):
                continue
            message = f"Does not count for Intent {intent.metadata.name}: {refusal.reason}."
            status = ApprovalStatus(refused=True, message=message[:MESSAGE_LIMIT])
            try:
                written = await self.kube.apply_status(
                    "approvals", namespace, refusal.approval, "Approval",
                    status.model_dump(mode="json", by_alias=True, exclude_none=True), "approval-refused")
            except ApiError as err:
                log.warning("could not mark Approval %s/%s refused: %s", namespace, refusal.approval, err)
                continue
            self._keep(written)
            self.audit.note("approval.refused", f"{namespace}/{refusal.approval}", {
                "intent": name_of(intent), "intentUid": uid_of(intent), "approver": refusal.approver,
                "reason": refusal.reason})
            meta = approval.metadata
            self.recorder.post(ObjectRef(API_VERSION, "Approval", meta.name or "", namespace, meta.uid),
                               "ApprovalRefused", "Decide", f"{message} The Intent keeps waiting for a valid approval.",
                               "Warning", ref_of(intent))

    async def renew(self, intent: StoredIntent, facts: IntentFacts) -> None:
        """Any call by the holder that touches the Device keeps its lease: the idle TTL starts again."""
        if self.leases is not None and not intent.spec.dry_run and facts.action != "release":
            await self.leases.renew(namespace_of(intent), intent.spec.device, facts.requester, facts.holder_id)

    async def consume(self, intent: StoredIntent, approval: str) -> None:
        """Mark the approval used. Best effort: it names this Intent's UID, so it cannot count for another."""
        status = ApprovalStatus(consumed=True, consumed_at=datetime.now(UTC).replace(microsecond=0),
                                message=f"Used by Intent {intent.metadata.name}")
        try:
            await self.kube.apply_status("approvals", namespace_of(intent), approval, "Approval",
                                         status.model_dump(mode="json", by_alias=True, exclude_none=True),
                                         "approval-consumed")
        except ApiError as err:
            log.warning("could not mark Approval %s used by Intent %s: %s", approval, name_of(intent), err)

    def _keep(self, written: dict[str, object]) -> None:
        try:
            self.approvals.upsert(written)
        except Malformed as err:  # the API server's own answer: cannot be, but must not stop the decision
            log.warning("%s", err)
