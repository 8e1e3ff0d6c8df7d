"""A Rule acting: the author's rights checked, then one Intent per action, made in the Rule's ServiceAccount's name.

The Intents are created with an Impersonate-User header on the controller's own client (the controller may
`impersonate` serviceaccounts, chart controller-rbac.yaml; a ServiceAccount's groups follow from its name, so
none are impersonated): the API server authenticates the call as the ServiceAccount, so the admission policies
hold as for any requester (spec.requester is the creator, spec.requesterGroups exactly its groups), and creating
an Intent needs the ServiceAccount's own `create` on intents. Past creation, the Intent is decided as an agent's
is: nothing in the pipeline trusts the controller for it. A Rule can never do what its ServiceAccount could not.

Before that, the controller checks that the revision's author may do what the Rule does (the admission policy
refuses such a write too; this holds even for a Rule written before a role was taken away): `impersonate` on (or
`use`, as the admission policy allows) serviceaccounts/<sa> in the namespace, and each action's verb on
devices/<device>. The verb is the actuator's level in the Device's trusted contract, never a guess: while that
contract is not known, the Rule does not act (`Authority.unknown`), since checking `write` would let an action
that needs `config` pass.

Names are not guessable: `<rule>-<firing>-<action>-<16 random base32 characters>`. A name anybody else could
predict could be taken first (an agent that may create Intents creates it on a harmless device), and the API
server would then refuse the Rule's own. A name that exists counts as the Rule's only when that Intent is exactly
what the Rule would make: its requester is the Rule's ServiceAccount (which admission binds to the creator), it
carries the Rule's label, and its device, actuator, action, value and hold are the action's (`taken_by`).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.rule import RULE_LABEL, Rule, RuleAction
from corral.contract.model import Contract
from corral.kube.access import AccessReviews, recorded_or_implied
from corral.kube.client import ApiError, path_of
from corral.kube.objects import Kube

NAME_LIMIT = 63  # Intent names and label values alike
ANSWER_TTL_S = 10.0  # as kube/access.py keeps its answers: an RBAC change shows within this
TOKEN_BYTES = 10  # 80 bits: 16 base32 characters


def sa_username(namespace: str, service_account: str) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


def sa_groups(namespace: str) -> list[str]:
    """A ServiceAccount's groups, as the API server authenticates it (and as Intent admission compares them)."""
    return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]


def author_groups(rule: Rule) -> list[str]:
    """The groups the author's rights are reviewed with: spec.authorGroups, which admission binds to the writer's
    own groups, else only what the name implies (kube.access.recorded_or_implied)."""
    return recorded_or_implied(rule.spec.author, rule.spec.author_groups)


def shortened(text: str, limit: int = NAME_LIMIT) -> str:
    """`text` if it fits; else its head and a hash of the whole, so that two long names stay apart."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[:limit - 9].rstrip('-.')}-{digest}"


def label_value(rule_name: str) -> str:
    """The corral.dev/rule label of the Rule's Intents (a label value holds at most 63 characters)."""
    return shortened(rule_name)


def fresh_token() -> str:
    """16 lower-case base32 characters from the OS's CSPRNG: valid in a name, and not to be guessed."""
    return base64.b32encode(secrets.token_bytes(TOKEN_BYTES)).decode().lower()


def intent_name(rule_name: str, firing: int, index: int, token: str) -> str:
    """`<rule>-<firing>-<action>-<token>`: readable, and unguessable by its token. The status names it before it
    is made, so a retry after a crash makes it under the same name (the name is what makes it once)."""
    suffix = f"-{firing}-{index}-{token}"
    return shortened(rule_name, NAME_LIMIT - len(suffix)).rstrip("-.") + suffix


def intent_body(rule: Rule, name: str, action: RuleAction) -> dict[str, Any]:
    """The Intent the Rule makes for one action."""
    namespace, spec = rule.metadata.namespace or "", rule.spec
    intent_spec: dict[str, Any] = {
        "device": action.device, "actuator": action.actuator, "action": action.action,
        "params": {"value": action.value}, "reason": spec.reason,
        "requester": sa_username(namespace, spec.service_account_name), "requesterGroups": sa_groups(namespace)}
    if action.hold_for is not None:
        intent_spec["holdFor"] = action.hold_for
    return {"apiVersion": API_VERSION, "kind": "Intent",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {RULE_LABEL: label_value(rule.metadata.name or "")}},
            "spec": intent_spec}


_SAME = ("requester", "device", "actuator", "action", "params", "holdFor")


@dataclass(frozen=True)
class Holder:
    """Whoever holds a name the Rule chose: the Intent's requester (its creator, which admission binds) and what
    that Intent is."""

    requester: str
    what: str

    def __str__(self) -> str:
        return f"{self.requester} ({self.what})"


def taken_by(existing: dict[str, Any], wanted: dict[str, Any]) -> Holder | None:
    """None when the Intent found under the name is the one the Rule makes (its own, made before a crash); else who
    holds the name and with what. Only the controller, impersonating the ServiceAccount, makes one that passes."""
    spec, labels = existing.get("spec") or {}, (existing.get("metadata") or {}).get("labels") or {}
    label = wanted["metadata"]["labels"][RULE_LABEL]
    if labels.get(RULE_LABEL) == label and all(spec.get(k) == wanted["spec"].get(k) for k in _SAME):
        return None
    marked = "with" if labels.get(RULE_LABEL) == label else "without"
    return Holder(str(spec.get("requester") or "nobody known")[:512],
                  f"an Intent on devices/{str(spec.get('device'))[:63]}, actuator {str(spec.get('actuator'))[:32]}, "
                  f"{marked} the Rule's label")


@dataclass(frozen=True)
class Made:
    """One action's Intent: made (or found made before), refused by the API server (its code and why), or its name
    held by somebody else's Intent (`taken_by`)."""

    name: str
    device: str
    code: str | None = None
    message: str = ""
    taken_by: Holder | None = None


@dataclass(frozen=True)
class Authority:
    """What the revision's author may not do of what the Rule does (`missing`), and the Devices whose contract is
    not known, so that the verb the author needs cannot be told (`unknown`). Either: the Rule does not act."""

    missing: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


class Acting:
    def __init__(self, kube: Kube, access: AccessReviews,
                 contract_of: Callable[[str, str], Contract | None]) -> None:
        self.kube = kube
        self.access = access
        self.contract_of = contract_of  # (namespace, Device) -> its trusted contract, with the risk floors
        # remembered briefly, bounded: (user, groups, verb, namespace, ServiceAccount) -> (until, allowed)
        self._answers: dict[tuple[str, tuple[str, ...], str, str, str], tuple[float, bool]] = {}

    async def authority(self, rule: Rule) -> Authority:
        namespace, spec = rule.metadata.namespace or "", rule.spec
        author, groups = spec.author, author_groups(rule)
        missing, unknown = [], []
        account = spec.service_account_name
        if not (await self._may_use(author, groups, namespace, account, "impersonate")
                or await self._may_use(author, groups, namespace, account, "use")):
            missing.append(f"impersonate (or use) serviceaccounts/{account}")
        for action in spec.actions:
            contract = self.contract_of(namespace, action.device)
            if contract is None:
                unknown.append(action.device)
                continue
            actuator = contract.actuator(action.actuator)
            if actuator is None:
                missing.append(f"set {action.actuator} on devices/{action.device} (its contract has no such actuator)")
            elif not await self.access.may(author, actuator.level, namespace, action.device, groups):
                missing.append(f"{actuator.level} on devices/{action.device}")
        return Authority(missing, sorted(set(unknown)))

    async def make(self, rule: Rule, name: str, action: RuleAction) -> Made:
        """Create the action's Intent as the Rule's ServiceAccount. One that exists already counts only when it is
        the Rule's own (a retry after a crash); anybody else's is reported as holding the name."""
        namespace = rule.metadata.namespace or ""
        body = intent_body(rule, name, action)
        # The user alone: for a ServiceAccount the API server adds its groups itself (system:serviceaccounts,
        # system:serviceaccounts:<ns>, system:authenticated), so the controller needs no right to impersonate groups.
        headers = [("Impersonate-User", body["spec"]["requester"])]
        try:
            await self.kube.api.request("POST", path_of(GROUP, VERSION, "intents", namespace), body=body,
                                        impersonate=headers)
        except ApiError as err:
            if err.status == 409:
                return await self._existing(namespace, name, action, body)
            code = "DENY_SCOPE" if err.status in (401, 403) else "DENY_ARGUMENTS"
            return Made(name, action.device, code, f"the API server refused the Intent: {err.message}"[:900])
        return Made(name, action.device)

    async def _existing(self, namespace: str, name: str, action: RuleAction, wanted: dict[str, Any]) -> Made:
        try:
            existing = await self.kube.api.request("GET", path_of(GROUP, VERSION, "intents", namespace, name))
        except ApiError as err:
            if err.status != 404:
                raise
            # Gone again at once: whoever held it, its name may stand in the replay index for another request.
            return Made(name, action.device, taken_by=Holder("somebody", "an Intent deleted before it could be read"))
        return Made(name, action.device, taken_by=taken_by(existing, wanted))

    async def _may_use(self, user: str, groups: list[str], namespace: str, service_account: str, verb: str) -> bool:
        question = (user, tuple(sorted(groups)), verb, namespace, service_account)
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
