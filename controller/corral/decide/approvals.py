"""Which approvals count for an Intent: pure rules, one reason per refusal.

An approval counts only if it names this Intent's UID and the hash of its
exact parameters, has not expired, has not been used, comes from someone
RBAC allows to approve on that device, and is not from the requester. The
first approval that does not count ends the Intent (DENY_APPROVAL): an
approval that was meant for something else must never be reinterpreted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal


@dataclass(frozen=True)
class ApprovalView:
    """An Approval for this Intent's name, with the approver's `approve` permission already looked up."""

    name: str
    intent_uid: str
    params_hash: str
    decision: Literal["Approve", "Deny"]
    approver: str
    approver_may_approve: bool
    created_at: datetime
    expires_at: datetime | None = None
    consumed: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    state: Literal["approved", "denied", "invalid", "pending"]
    message: str
    approvals: tuple[str, ...] = ()


def judge_approvals(
    approvals: list[ApprovalView],
    intent_uid: str,
    params_hash: str,
    requester: str,
    needed: int,
    now: datetime,
    lifetime: timedelta,
) -> Verdict:
    approvers: dict[str, str] = {}  # approver -> approval name
    for approval in sorted(approvals, key=lambda a: (a.created_at, a.name)):
        problem = why_not(approval, intent_uid, params_hash, requester, now, lifetime)
        if problem is not None:
            return Verdict("invalid", f"Approval {approval.name} does not count: {problem}.")
        if approval.decision == "Deny":
            reason = f": {approval.reason}" if approval.reason else ""
            return Verdict("denied", f"Denied by {approval.approver}{reason}.", (approval.name,))
        approvers.setdefault(approval.approver, approval.name)
        if len(approvers) >= needed:
            return Verdict("approved", f"Approved by {', '.join(sorted(approvers))}.", tuple(approvers.values()))
    if approvers:
        return Verdict("pending", f"{len(approvers)} of {needed} approvals so far.")
    return Verdict("pending", "No approval yet.")


def why_not(
    approval: ApprovalView, intent_uid: str, params_hash: str, requester: str, now: datetime, lifetime: timedelta
) -> str | None:
    """The reason an approval does not count, or None when it does."""
    if approval.intent_uid != intent_uid:
        return (
            f"it is for another Intent (uid {approval.intent_uid}, this one is {intent_uid}); "
            "an approval is bound to one request and cannot be reused"
        )
    if approval.params_hash != params_hash:
        return "it approves other parameters than this Intent's (paramsHash differs)"
    if approval.consumed:
        return "it was already used; an approval counts once"
    if approval.approver == requester:
        return f"{requester} cannot approve their own request"
    if not approval.approver_may_approve:
        return f"{approval.approver} does not hold the 'approve' verb on this device"
    expiry = min(approval.expires_at or approval.created_at + lifetime, approval.created_at + lifetime)
    if now > expiry:
        return f"it expired at {expiry:%Y-%m-%d %H:%M:%S} UTC"
    return None
