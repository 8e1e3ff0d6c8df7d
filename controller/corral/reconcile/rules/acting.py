"""A Rule acting: the author's rights checked, then one Intent per action, made in the Rule's ServiceAccount's name.

The Intents are created with an Impersonate-User header on the controller's own client (the controller may
`impersonate` serviceaccounts, chart controller-rbac.yaml; a ServiceAccount's groups follow from its name, so
none are impersonated): the API server authenticates the call as the ServiceAccount, so the admission policies hold as for any requester (spec.requester is the creator,
spec.requesterGroups exactly its groups), and creating an Intent needs the ServiceAccount's own `create` on
intents. Past creation, the Intent is decided as an agent's is: nothing in the pipeline trusts the controller
for it. A Rule can never do what its ServiceAccount could not.

Before that, the controller checks that the revision's author may do what the Rule does (D2's admission policy
refuses such a write too; this holds even for a Rule written before a role was taken away): `impersonate` on
(or `use`, as the admission policy allows) serviceaccounts/<sa> in the namespace, and each action's verb on devices/<device> (the actuator's level in the
device's contract; `write`, the lowest, while the contract is not known to this replica).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.rule import RULE_LABEL, Rule, RuleAction
from corral.kube.access import AccessReviews, implied_groups
from corral.kube.client import ApiError, path_of
from corral.kube.objects import Kube
from corral.reconcile.devices.port import DeviceView

NAME_LIMIT = 63  # Intent names and label values alike
ANSWER_TTL_S = 10.0  # as kube/access.py keeps its answers: an RBAC change shows within this


def sa_username(namespace: str, service_account: str) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


def sa_groups(namespace: str) -> list[str]:
    """A ServiceAccount's groups, as the API server authenticates it (and as Intent admission compares them)."""
    return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]


def shortened(text: str, limit: int = NAME_LIMIT) -> str:
    """`text` if it fits; else its head and a hash of the whole, so that two long names stay apart."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[:limit - 9].rstrip('-.')}-{digest}"


def label_value(rule_name: str) -> str:
    """The corral.dev/rule label of the Rule's Intents (a label value holds at most 63 characters)."""
    return shortened(rule_name)


def intent_name(rule_name: str, uid: str | None, firing: int, index: int) -> str:
    """Deterministic, so that the status names the Intents before they exist and a retry makes no second one:
    `<rule>-<uid>-<firing>-<action>`. The Rule's uid (its first 5 hex digits) keeps a Rule deleted and made again
    under the same name from meeting its predecessor's Intents (kept for the retention time) as its own."""
    suffix = f"-{(uid or '').replace('-', '')[:5] or 'x'}-{firing}-{index}"
    return shortened(rule_name, NAME_LIMIT - len(suffix)) + suffix


@dataclass(frozen=True)
class Made:
    """One action's Intent: made, or refused by the API server (its code and why)."""

    name: str
    device: str
    code: str | None = None
    message: str = ""


class Acting:
    def __init__(self, kube: Kube, access: AccessReviews,
                 view_of: Callable[[str, str], DeviceView | None]) -> None:
        self.kube = kube
        self.access = access
        self.view_of = view_of
        self._answers: dict[tuple[str, str, str, str], tuple[float, bool]] = {}  # remembered briefly, bounded

    async def author_lacks(self, rule: Rule) -> list[str]:
        """What the revision's author may not do of what the Rule does; empty: nothing."""
        namespace, spec = rule.metadata.namespace or "", rule.spec
        author, groups = spec.author, implied_groups(spec.author)
        missing = []
        account = spec.service_account_name
        if not (await self._may_use(author, groups, namespace, account, "impersonate")
                or await self._may_use(author, groups, namespace, account, "use")):
            missing.append(f"impersonate (or use) serviceaccounts/{account}")
        for action in spec.actions:
            verb = self.verb_of(namespace, action)
            if not await self.access.may(author, verb, namespace, action.device, groups):
                missing.append(f"{verb} on devices/{action.device}")
        return missing

    def verb_of(self, namespace: str, action: RuleAction) -> str:
        view = self.view_of(namespace, action.device)
        contract = view.contract if view is not None else None
        actuator = contract.actuator(action.actuator) if contract is not None else None
        return actuator.level if actuator is not None else "write"

    async def make(self, rule: Rule, name: str, action: RuleAction) -> Made:
        """Create the action's Intent as the Rule's ServiceAccount; one that exists already (a retry) counts."""
        namespace, spec = rule.metadata.namespace or "", rule.spec
        user, groups = sa_username(namespace, spec.service_account_name), sa_groups(namespace)
        intent_spec: dict[str, object] = {
            "device": action.device, "actuator": action.actuator, "action": action.action,
            "params": {"value": action.value}, "reason": spec.reason, "requester": user, "requesterGroups": groups}
        if action.hold_for is not None:
            intent_spec["holdFor"] = action.hold_for
        body = {"apiVersion": API_VERSION, "kind": "Intent",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {RULE_LABEL: label_value(rule.metadata.name or "")}},
                "spec": intent_spec}
        # The user alone: for a ServiceAccount the API server adds its groups itself (system:serviceaccounts,
        # system:serviceaccounts:<ns>, system:authenticated), so the controller needs no right to impersonate groups.
        headers = [("Impersonate-User", user)]
        try:
            await self.kube.api.request("POST", path_of(GROUP, VERSION, "intents", namespace), body=body,
                                        impersonate=headers)
        except ApiError as err:
            if err.status == 409:
                return Made(name, action.device)
            code = "DENY_SCOPE" if err.status in (401, 403) else "DENY_ARGUMENTS"
            return Made(name, action.device, code, f"the API server refused the Intent: {err.message}"[:900])
        return Made(name, action.device)

    async def _may_use(self, user: str, groups: list[str], namespace: str, service_account: str, verb: str) -> bool:
        question = (user, verb, namespace, service_account)
        kept = self._answers.get(question)
        if kept is not None and kept[0] > time.monotonic():
            return kept[1]
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": groups,
                           "resourceAttributes": {"group": "", "resource": "serviceaccounts", "verb": verb,
                                                  "namespace": namespace, "name": service_account}}}
        answer = await self.kube.api.request(
            "POST", path_of("authorization.k8s.io", "v1", "subjectaccessreviews"), body=review)
        allowed = bool((answer.get("status") or {}).get("allowed"))
        if len(self._answers) >= 10_000:
            self._answers.clear()
        self._answers[question] = (time.monotonic() + ANSWER_TTL_S, allowed)
        return allowed
