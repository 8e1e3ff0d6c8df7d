"""Which approvals count for an Intent, and who is a person: pure rules, one reason per refusal.

An approval counts only if it names this Intent's UID and the hash of its exact parameters, has not
expired, has not been used, comes from a person RBAC allows to approve on that device, and is not from
the requester. One that does not count is refused on its own (the reason goes on its status) and the
Intent keeps waiting: anyone allowed to create Approvals must not be able to end someone else's request
with a bad one, and a mistaken approval can be followed by a right one. An approval meant for something
else is never reinterpreted; it only never counts.

People are Users (client certificates, static tokens, OIDC) and ServiceAccounts of the namespace set
aside for people; other ServiceAccounts are programs (an agent holding a second ServiceAccount must not
approve its own requests), unless named one by one. Kubernetes' own `system:` identities are never people.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from corral.contract.text import written_text

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class People:
    """Who counts as a person: Users, ServiceAccounts in `namespace`, and the ServiceAccounts named in `also`
    (full usernames; each one weakens the two-person rule)."""

    namespace: str = "corral-people"
    also: frozenset[str] = frozenset()

    def includes(self, username: str) -> bool:
        if username in self.also:
            return True
        if username.startswith(SERVICE_ACCOUNT_PREFIX):
            namespace, _, name = username[len(SERVICE_ACCOUNT_PREFIX):].partition(":")
            return bool(name) and namespace == self.namespace
        return not username.startswith("system:") and bool(username)

    def why_not(self, username: str) -> str:
        if username.startswith(SERVICE_ACCOUNT_PREFIX):
            return (f"{username} is a ServiceAccount outside {self.namespace}, the namespace for people; programs "
                    f"do not approve (corral people add NAME makes an identity for a person)")
        return f"{username} is a Kubernetes system identity, not a person"


DEFAULT_PEOPLE = People()


def people_of(namespace: str, service_accounts: Iterable[str]) -> People:
    """People as the command line names them (`corral run`, `corral mcp`): the people namespace, and the
    ServiceAccounts (NAMESPACE/NAME) that count as people too; ValueError names one that is not NAMESPACE/NAME."""
    also = set()
    for item in service_accounts:
        ns, _, name = item.partition("/")
        if not ns or not name or "/" in name:
            raise ValueError(f"{item!r}: use NAMESPACE/NAME of a ServiceAccount")
        also.add(f"{SERVICE_ACCOUNT_PREFIX}{ns}:{name}")
    return People(namespace=namespace, also=frozenset(also))


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
class Refusal:
    """An approval that does not count, and why (for its status, the audit log and an Event)."""

    approval: str
    approver: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    state: Literal["approved", "denied", "pending"]
    message: str
    approvals: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = ()


def judge_approvals(
    approvals: Collection[ApprovalView],
    intent_uid: str,
    params_hash: str,
    requester: str,
    needed: int,
    now: datetime,
    lifetime: timedelta,
    people: People = DEFAULT_PEOPLE,
) -> Verdict:
    approvers: dict[str, str] = {}  # approver -> approval name
    refused: list[Refusal] = []
    for approval in sorted(approvals, key=lambda a: (a.created_at, a.name)):
        problem = why_not(approval, intent_uid, params_hash, requester, now, lifetime, people)
        if problem is not None:
            refused.append(Refusal(approval.name, approval.approver, problem))
            continue
        if approval.decision == "Deny":
            said = written_text(approval.reason)  # the approver's words reach the requester (an agent): made safe
            reason = f": {said}" if said else ""
            return Verdict("denied", f"Denied by {approval.approver}{reason}.", (approval.name,), tuple(refused))
        approvers.setdefault(approval.approver, approval.name)
        if len(approvers) >= needed:
            return Verdict("approved", f"Approved by {', '.join(sorted(approvers))}.", tuple(approvers.values()),
                           tuple(refused))
    so_far = f"{len(approvers)} of {needed} approvals so far." if approvers else "No approval yet."
    if refused:
        last = refused[-1]
        so_far += f" Approval {last.approval} by {last.approver} does not count: {last.reason}."
    return Verdict("pending", so_far, refused=tuple(refused))


def why_not(
    approval: ApprovalView, intent_uid: str, params_hash: str, requester: str, now: datetime, lifetime: timedelta,
    people: People = DEFAULT_PEOPLE,
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
        return f"{requester} cannot decide on their own request"
    if not people.includes(approval.approver):
        return people.why_not(approval.approver)
    if not approval.approver_may_approve:
        return f"{approval.approver} does not hold the 'approve' verb on this device"
    expiry = min(approval.expires_at or approval.created_at + lifetime, approval.created_at + lifetime)
    if now > expiry:
        return f"it expired at {expiry:%Y-%m-%d %H:%M:%S} UTC"
    return None
