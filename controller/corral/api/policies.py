"""ValidatingAdmissionPolicies that make identities unforgeable, shipped beside the CRDs.

`Intent.spec.requester`, `Approval.spec.approver` and `ApprovalGrant.spec.grantor`
must be the username of whoever creates the object, and their groups (when filled
in) exactly the creator's groups, so an agent cannot act in someone else's name,
nobody can sign an approval as someone else, and nobody can claim a group to gain
a right. Only the requester may cancel an Intent, and only the requester and the controller may
change an Intent's metadata; its trace context never changes after creation. The CRD schemas already make the
specs immutable; the policies also refuse a changed identity on update so the
rule reads complete here. What a policy cannot see (an approver approving
their own Intent) the controller enforces.

Accepting a Device's changed contract (`spec.acceptCapability`) trusts the device with more than before,
so it needs the same right as approving one of its actions: the `approve` verb on that Device. Whoever
may patch Devices (a person's `kubectl apply`) may not accept a contract with it unless they may approve.
The same holds for a Device's `spec.freshness` (how old a cited reading may be) and `spec.bridge` (a bridged
device's acceptance: the contract hash standing in for its signature, and its broker topics).

An `ApprovalGrant` must list the values it covers or give a range (its Devices are checked by the CRD).

`AgentPause.spec.by` is the username of whoever writes it, on every create and update: who paused or
resumed agents is on the object, and cannot be claimed for someone else.

A `Rule` acts as its ServiceAccount, so writing one must not lend anybody more than they hold (no escalation
through a Rule). Every create, and every update that changes the spec, must name its writer as `spec.author`, and
the writer must hold the `impersonate` verb (or `use`, see `_rule_policy`) on that ServiceAccount, `write` on the
Device of every action and `read` on every input. `spec.authorGroups`, when set, must then be exactly the writer's
groups: the controller reviews the author with them later, so a right that comes from a group counts, and a
group nobody authenticated the writer with does not. Accepting an agent's revision (annotation corral.dev/accepted)
names the generation accepted and the person accepting, exactly, and needs the `approve` verb on that Rule. The
kept previous revision (annotation corral.dev/previous-spec) changes only with the spec, never on a create.
"""

from __future__ import annotations

from typing import Any

from corral.api.codes import CANCEL_ANNOTATION, GROUP, TRACEPARENT_ANNOTATION, VERSION
from corral.api.grant import VALUES_REQUIRED
from corral.api.rule import ACCEPTED_ANNOTATION, PREVIOUS_SPEC_ANNOTATION

POLICY_API = "admissionregistration.k8s.io/v1"


def _identity_policy(name: str, plural: str, kind: str, field: str, article: str) -> list[dict[str, Any]]:
    return _policy(name, plural, _identity_rules(kind, field, article))


def _identity_rules(kind: str, field: str, article: str) -> list[tuple[str, str]]:
    """spec.FIELD is the creator's username and spec.FIELDGroups, when set, exactly the creator's groups (as a set:
    order is not meaningful), so the controller may ask RBAC about them as if it were that person."""
    create_rule = (
        f"request.operation != 'CREATE' || object.spec.{field} == request.userInfo.username"
    )
    create_message = (
        f"'spec.{field} must be your own username: you are \"' + request.userInfo.username + '\" but the {kind} says \"' "
        f"+ object.spec.{field} + '\". {article} {kind} is made in the name of whoever creates it; set spec.{field} to \"' "
        f"+ request.userInfo.username + '\".'"
    )
    update_rule = f"request.operation != 'UPDATE' || object.spec.{field} == oldObject.spec.{field}"
    update_message = (
        f"'spec.{field} cannot change (it was \"' + oldObject.spec.{field} + '\"); create a new {kind} instead.'"
    )
    groups_rule, groups_message = _groups_rule(kind, field)
    return [(create_rule, create_message), (update_rule, update_message),
            (f"request.operation != 'CREATE' || {groups_rule}", groups_message)]


def _groups_rule(kind: str, field: str) -> tuple[str, str]:
    """spec.FIELDGroups, when set, is exactly the writer's groups (as a set: order is not meaningful)."""
    mine = "(has(request.userInfo.groups) ? request.userInfo.groups : [])"
    groups = f"object.spec.{field}Groups"
    rule = f"!has({groups}) || ({groups}.all(g, g in {mine}) && {mine}.all(g, g in {groups}))"
    message = (
        f"'spec.{field}Groups must be exactly the groups you are authenticated with: [' + {mine}.join(', ') + "
        f"'], but the {kind} says [' + {groups}.join(', ') + ']. Leave it out, or let corral fill it in.'"
    )
    return rule, message


def _cancel_rule() -> tuple[str, str]:
    """Only an Intent's requester withdraws it: nobody else may set or change the cancel annotation."""
    def value(obj: str) -> str:
        return (f"(has({obj}.metadata.annotations) && '{CANCEL_ANNOTATION}' in {obj}.metadata.annotations ? "
                f"{obj}.metadata.annotations['{CANCEL_ANNOTATION}'] : '')")
    rule = (f"request.operation != 'UPDATE' || {value('object')} == {value('oldObject')} || "
            "request.userInfo.username == object.spec.requester")
    message = (f"'only the requester (' + object.spec.requester + ') may cancel this Intent (annotation "
               f"{CANCEL_ANNOTATION}); you are ' + request.userInfo.username + '. An approver denies instead.'")
    return rule, message


def _metadata_rules() -> list[tuple[str, str]]:
    """An Intent belongs to its requester: nobody else may change its annotations, labels, finalizers or owners
    (an agent could otherwise rewrite the trace id an admin's signed audit records carry, or hold the Intent with a
    finalizer). Whoever may write Intents' status (the controller; cluster administrators and Kubernetes' garbage
    collector) may still change them: the controller is named by its right, not by a name each install chooses.
    The trace context is read once, at creation, so it cannot change at all."""
    def same(field: str) -> str:
        return f"object.metadata.?{field}.orValue({EMPTY[field]}) == oldObject.metadata.?{field}.orValue({EMPTY[field]})"
    unchanged = " && ".join(same(field) for field in EMPTY)
    controller = ("authorizer.group('corral.dev').resource('intents').subresource('status')"
                  ".namespace(object.metadata.namespace).name(object.metadata.name).check('patch').allowed()")
    owner_rule = (f"request.operation != 'UPDATE' || ({unchanged}) || "
                  f"request.userInfo.username == object.spec.requester || {controller}")
    owner_message = ("'this Intent belongs to its requester (' + object.spec.requester + '): only they and the "
                     "controller may change its annotations, labels, finalizers or owner references; you are ' + "
                     "request.userInfo.username + '.'")

    def trace(obj: str) -> str:
        return f"{obj}.metadata.?annotations[?'{TRACEPARENT_ANNOTATION}'].orValue('')"
    trace_rule = f"request.operation != 'UPDATE' || {trace('object')} == {trace('oldObject')}"
    trace_message = (f"'annotation {TRACEPARENT_ANNOTATION} is the trace the Intent was created in and cannot change "
                     "(it was \"' + " + trace("oldObject") + " + '\").'")
    return [(owner_rule, owner_message), (trace_rule, trace_message)]


# What each guarded metadata field is when absent, so that absent and empty compare equal.
EMPTY = {"annotations": "{}", "labels": "{}", "finalizers": "[]", "ownerReferences": "[]"}


def _policy(name: str, plural: str, rules: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """A policy that refuses (Forbidden) whatever fails one of its rules (CEL expression, message), and its binding."""
    policy = {
        "apiVersion": POLICY_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _match(plural),
            "validations": [{"expression": expression, "messageExpression": message, "reason": "Forbidden"}
                            for expression, message in rules],
        },
    }
    return [policy, _binding(name)]


def _match(plural: str) -> dict[str, Any]:
    # matchConstraints is one atomic value for server-side apply: it is written out with every field the API
    # server would default, so a `kubectl apply --server-side` of these files after the demo (or the chart)
    # installed them co-owns it instead of conflicting over defaults.
    return {
        "matchPolicy": "Equivalent",
        "namespaceSelector": {},
        "objectSelector": {},
        "resourceRules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "operations": ["CREATE", "UPDATE"],
                "resources": [plural],
                "scope": "*",
            }
        ],
    }


def _binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": POLICY_API,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


# Whether the writer holds the approve verb on the Device being written: what a person's call on it needs.
_MAY_APPROVE_DEVICE = ("authorizer.group('corral.dev').resource('devices').namespace(object.metadata.namespace)"
                       ".name(object.metadata.name).check('approve').allowed()")


def _accept_contract_policy(name: str) -> list[dict[str, Any]]:
    accepted = "(has(object.spec.acceptCapability) ? object.spec.acceptCapability : '')"
    before = ("(oldObject != null && has(oldObject.spec.acceptCapability) ? oldObject.spec.acceptCapability : '')")
    message = ("'spec.acceptCapability accepts a changed device contract, which needs the approve verb on devices/' "
               "+ object.metadata.name + ' (corral.dev); ' + request.userInfo.username + ' does not have it. Ask an "
               "approver to run corral devices accept-contract ' + object.metadata.name + '.'")
    return _policy(name, "devices", [(f"{accepted} == {before} || {_MAY_APPROVE_DEVICE}", message)])


def _freshness_policy(name: str) -> list[dict[str, Any]]:
    """spec.freshness decides how old a reading an approval or a grant relies on may be: an approver's call, like
    accepting a contract, so it needs the approve verb on the Device (which agents' roles never carry)."""
    unchanged = ("(!has(object.spec.freshness) && (oldObject == null || !has(oldObject.spec.freshness))) || "
                 "(oldObject != null && has(object.spec.freshness) && has(oldObject.spec.freshness) && "
                 "object.spec.freshness == oldObject.spec.freshness)")
    message = ("'spec.freshness sets how old a cited reading of devices/' + object.metadata.name + ' may be, which "
               "needs the approve verb on it (corral.dev); ' + request.userInfo.username + ' does not have it. Ask an "
               "approver to set it.'")
    return _policy(name, "devices", [(f"{unchanged} || {_MAY_APPROVE_DEVICE}", message)])


def _bridge_policy(name: str) -> list[dict[str, Any]]:
    """spec.bridge stands in for a firmware signature (the contract hash a person accepted) and grants broker topics
    (docs/bridge.md): setting or changing it is accepting a device, so it needs the approve verb on the Device."""
    unchanged = ("(!has(object.spec.bridge) && (oldObject == null || !has(oldObject.spec.bridge))) || "
                 "(oldObject != null && has(object.spec.bridge) && has(oldObject.spec.bridge) && "
                 "object.spec.bridge == oldObject.spec.bridge)")
    message = ("'spec.bridge accepts a bridged device for devices/' + object.metadata.name + ' (its contract and "
               "broker topics), which needs the approve verb on it (corral.dev); ' + request.userInfo.username + ' "
               "does not have it. Ask an approver to run corral devices accept-discovered.'")
    return _policy(name, "devices", [(f"{unchanged} || {_MAY_APPROVE_DEVICE}", message)])


def _pause_policy(name: str) -> list[dict[str, Any]]:
    """Whoever pauses or resumes agents is named by the API server: spec.by is the writer's username on every
    create and update (a pause is rewritten by each person who resumes or pauses again)."""
    rule = "object.spec.by == request.userInfo.username"
    message = ("'spec.by must be your own username: you are \"' + request.userInfo.username + '\" but the AgentPause "
               "says \"' + object.spec.by + '\". Pause and resume with corral agents pause/resume, which fill it in.'")
    return _policy(name, "agentpauses", [(rule, message)])


def _grant_bounds_policy(name: str) -> list[dict[str, Any]]:
    """A grant lists the values it covers or gives a range: "any value" is no bound. (Its Devices are checked by
    the CRD's own rules; free JSON values have no type a CRD rule could count.)"""
    rule = "(has(object.spec.values) && size(object.spec.values) > 0) || has(object.spec.range)"
    return _policy(name, "approvalgrants", [(rule, f"'{VALUES_REQUIRED}'")])


def _rule_policy(name: str) -> list[dict[str, Any]]:
    """Who may write a Rule, and accept one.

    The ServiceAccount: `impersonate` lets its holder act as the account in every way, directly; `use` is
    accepted as well because it is the narrower grant a person can give ("may name it in Rules", nothing more):
    a Rule written with `use` still cannot do more than its writer, since the writer needs `write` on every
    Device it sets. Verbs beyond `write` (an actuator of level `config`) come from the contract, which the API
    server cannot read; the controller checks those when the Rule acts (as its ServiceAccount)."""
    accepted = ACCEPTED_ANNOTATION
    variables = [
        ("specChanged", "request.operation == 'CREATE' || object.spec != oldObject.spec"),
        ("accepted", f"object.metadata.?annotations[?'{accepted}'].orValue('')"),
        ("acceptedBefore", f"oldObject == null ? '' : oldObject.metadata.?annotations[?'{accepted}'].orValue('')"),
        ("account", "authorizer.group('').resource('serviceaccounts').namespace(object.metadata.namespace)"
                    ".name(object.spec.serviceAccountName)"),
        ("unwritable", "object.spec.actions.map(a, a.device).filter(d, !authorizer.group('corral.dev')"
                       ".resource('devices').namespace(object.metadata.namespace).name(d).check('write').allowed())"),
        ("unreadable", "object.spec.inputs.filter(d, !authorizer.group('corral.dev').resource('devices')"
                       ".namespace(object.metadata.namespace).name(d).check('read').allowed())"),
        ("acceptance", "string(object.metadata.generation) + ':' + request.userInfo.username"),
        ("previous", f"object.metadata.?annotations[?'{PREVIOUS_SPEC_ANNOTATION}'].orValue('')"),
        ("previousBefore", f"oldObject == null ? '' : "
                           f"oldObject.metadata.?annotations[?'{PREVIOUS_SPEC_ANNOTATION}'].orValue('')"),
    ]
    author_groups, author_groups_message = _groups_rule("Rule", "author")
    rules = [
        (f"!variables.specChanged || {author_groups}", author_groups_message),
        ("!variables.specChanged || object.spec.author == request.userInfo.username",
         "'spec.author must be your own username: you are \"' + request.userInfo.username + '\" but the Rule says \"' "
         "+ object.spec.author + '\". Whoever writes a revision of a Rule is its author; set spec.author to \"' + "
         "request.userInfo.username + '\".'"),
        ("!variables.specChanged || variables.account.check('impersonate').allowed() || "
         "variables.account.check('use').allowed()",
         "'you (' + request.userInfo.username + ') may not name ServiceAccount ' + object.spec.serviceAccountName + "
         "': a Rule acts as its ServiceAccount, so writing one needs the impersonate or use verb on serviceaccounts/' "
         "+ object.spec.serviceAccountName + ' in ' + object.metadata.namespace + '. Name a ServiceAccount you may "
         "use, or ask a person to let you use this one.'"),
        ("!variables.specChanged || size(variables.unwritable) == 0",
         "'you (' + request.userInfo.username + ') lack the write verb on devices ' + "
         "variables.unwritable.join(', ') + ' (corral.dev): a Rule may only set Devices its writer may write.'"),
        ("!variables.specChanged || size(variables.unreadable) == 0",
         "'you (' + request.userInfo.username + ') lack the read verb on devices ' + "
         "variables.unreadable.join(', ') + ' (corral.dev): a Rule may only watch Devices its writer may read.'"),
        ("variables.accepted == variables.acceptedBefore || variables.accepted == variables.acceptance",
         f"'annotation {accepted} must be exactly \"' + variables.acceptance + '\" (the generation you accept, and "
         "your own username), but it says \"' + variables.accepted + '\". Accept with corral rules accept ' + "
         "object.metadata.name + '.'"),
        ("variables.accepted == variables.acceptedBefore || authorizer.group('corral.dev').resource('rules')"
         ".namespace(object.metadata.namespace).name(object.metadata.name).check('approve').allowed()",
         f"'accepting a revision of a Rule (annotation {accepted}) needs the approve verb on rules/' + "
         "object.metadata.name + ' (corral.dev); ' + request.userInfo.username + ' does not have it. Ask an "
         "approver to run corral rules accept ' + object.metadata.name + '.'"),
    ]
    policy, binding = _policy(name, "rules", [*rules, _previous_spec_rule()])
    policy["spec"]["variables"] = [{"name": key, "expression": expression} for key, expression in variables]
    return [policy, binding]


def _previous_spec_rule() -> tuple[str, str]:
    """The kept previous revision is what a restore puts back: it is written only in the write that replaces the
    spec (whose author the rules above bind to the writer), never alone and never on a create. A policy cannot
    parse JSON to compare it with the old spec; a restore checks it against the controller's records instead."""
    rule = ("request.operation == 'CREATE' ? variables.previous == '' : "
            "(variables.previous == variables.previousBefore || variables.specChanged)")
    message = (f"'annotation {PREVIOUS_SPEC_ANNOTATION} keeps the revision before an edit, so it is written only "
               "together with a change of spec (as iot.rules.put and corral rules restore do), never on its own or "
               "when a Rule is created. Change the spec in the same write, or leave the annotation as it is.'")
    return rule, message


def admission_policies() -> list[dict[str, Any]]:
    return [
        *_policy("corral-intent-requester", "intents", [*_identity_rules("Intent", "requester", "An"), _cancel_rule(),
                                                       *_metadata_rules()]),
        *_identity_policy("corral-approval-approver", "approvals", "Approval", "approver", "An"),
        *_identity_policy("corral-grant-grantor", "approvalgrants", "ApprovalGrant", "grantor", "An"),
        *_grant_bounds_policy("corral-grant-bounds"),
        *_accept_contract_policy("corral-device-accept-contract"),
        *_freshness_policy("corral-device-freshness"),
        *_bridge_policy("corral-device-bridge"),
        *_pause_policy("corral-agents-pause-by"),
        *_rule_policy("corral-rule-writer"),
    ]
