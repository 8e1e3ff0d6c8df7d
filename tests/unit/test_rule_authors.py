"""Who wrote a Rule's revision and when, as the controller may believe it (issue 41, findings 10 and 11).

10: an edit's time was read from the Rule's managedFields, which its writer may overwrite: a backdated edit kept the
standing grants it should void. The time is now when the controller saw the edit.
11: a Rule whose author's rights come from a group never fired: the author was reviewed with the groups the name
implies. The author's groups are recorded at admission (spec.authorGroups, bound to the writer's own) and reviewed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from corral.api.policies import admission_policies
from corral.api.rule import PREVIOUS_SPEC_ANNOTATION, Rule, RuleSpec
from corral.audit.log import AuditLog
from corral.decide.revisions import edit_seen_at, replacing, restoring, spec_document, voids
from corral.gateway.tools.rules import spec_of
from corral.kube.access import AccessReviews, implied_groups, recorded_or_implied
from corral.kube.objects import Kube
from corral.reconcile.rules.acting import Acting, author_groups
from corral.reconcile.rules.revisions import Revisions

NS, ACCOUNT = "home", "porch-rule"
RULE_SA = f"system:serviceaccount:{NS}:{ACCOUNT}"
AGENT = f"system:serviceaccount:{NS}:agent"
CAROL, HOUSEHOLD = "carol", ["household", "system:authenticated"]
SEEN = datetime(2026, 12, 3, 7, 0, 0, 400_000, tzinfo=UTC)
BACKDATED = "2000-01-01T00:00:00Z"


def spec(author: str = AGENT, groups: list[str] | None = None, level: int = 80) -> RuleSpec:
    return RuleSpec.model_validate({
        "serviceAccountName": ACCOUNT, "author": author, **({"authorGroups": groups} if groups else {}),
        "inputs": ["porch-sensor"], "condition": 'readings["porch-sensor"]["lux"] < 10.0', "reason": "dark",
        "actions": [{"device": "porch-light", "actuator": "brightness", "action": "set_value", "value": level}]})


# ---- 10: the edit's time is when the controller saw it -----------------------------------------------------------

def test_an_edit_counts_from_when_the_controller_saw_it_in_whole_seconds() -> None:
    assert edit_seen_at(SEEN) == SEEN.replace(microsecond=0)
    before, same, after = SEEN - timedelta(days=1), SEEN.replace(microsecond=0), SEEN + timedelta(seconds=1)
    assert voids(2, NS, ACCOUNT, RULE_SA, False, before, SEEN), "a grant standing before the edit"
    assert voids(2, NS, ACCOUNT, RULE_SA, False, same, SEEN), "the same second"
    assert not voids(2, NS, ACCOUNT, RULE_SA, False, after, SEEN), "a person's grant after the edit was seen"


def grant_body(name: str, requester: str, created: datetime) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "ApprovalGrant",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": "7",
                         "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "spec": {"grantor": CAROL, "requester": requester, "devices": ["porch-light"], "actuators": ["brightness"],
                     "range": {"minimum": 0, "maximum": 100}, "uses": 5,
                     "expiresAt": (SEEN + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")}}


@dataclass
class GrantsApi:
    """The API server's answers about grants: the list, one grant, and the status writes (recorded)."""

    grants: dict[str, dict[str, Any]]
    patched: list[str] = field(default_factory=list)

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        if method == "GET" and path.endswith("/approvalgrants"):
            return {"items": list(self.grants.values())}
        name = path.split("/approvalgrants/")[1].split("/")[0]
        if method == "GET":
            return self.grants[name]
        self.patched.append(name)
        return self.grants[name]


@dataclass
class Sealed:
    seq: int = 1
    hash: str = "0" * 64


class Audit:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def seal(self, kind: str, subject: str, data: dict[str, Any], uid: str | None = None) -> Sealed:
        self.records.append(data)
        return Sealed()


def test_a_backdated_edit_still_voids_the_standing_grant() -> None:
    # The agent edits its Rule, then rewrites managedFields so that the edit seems to predate every grant.
    rule = Rule.model_validate({
        "apiVersion": "corral.dev/v1alpha1", "kind": "Rule",
        "metadata": {"name": "dusk", "namespace": NS, "uid": "u-1", "generation": 2, "managedFields": [
            {"manager": "corral-gateway", "operation": "Update", "time": BACKDATED, "fieldsV1": {"f:spec": {}}}]},
        "spec": spec_document(spec())})
    api = GrantsApi({
        "standing": grant_body("standing", RULE_SA, SEEN - timedelta(hours=2)),
        "after": grant_body("after", RULE_SA, SEEN + timedelta(seconds=1)),
        "for-the-agent": grant_body("for-the-agent", AGENT, SEEN - timedelta(hours=2))})
    audit = Audit()
    kube = cast(Kube, type("K", (), {"api": api})())
    revisions = Revisions(kube, cast(AuditLog, audit), clock=lambda: SEEN)
    assert asyncio.run(revisions.observe(rule)) is not None
    assert api.patched == ["standing"] and audit.records[0]["voidedGrants"] == ["standing"]


# ---- 11: the author's groups, recorded at admission and reviewed -------------------------------------------------

def test_the_author_is_reviewed_with_the_groups_admission_recorded_else_those_the_name_implies() -> None:
    assert author_groups(Rule.model_validate({"metadata": {"name": "r", "namespace": NS},
                                              "spec": spec_document(spec(CAROL, HOUSEHOLD))})) == HOUSEHOLD
    assert author_groups(Rule.model_validate({"metadata": {"name": "r", "namespace": NS},
                                              "spec": spec_document(spec(CAROL))})) == ["system:authenticated"]
    assert recorded_or_implied(AGENT, None) == implied_groups(AGENT)


@dataclass
class Reviews:
    """SubjectAccessReviews: allowed only for carol in the household group."""

    asked: list[tuple[str, list[str], str]] = field(default_factory=list)

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        assert body is not None
        attributes = body["spec"]["resourceAttributes"]
        self.asked.append((body["spec"]["user"], body["spec"]["groups"], attributes["verb"]))
        return {"status": {"allowed": "household" in body["spec"]["groups"]}}


def test_a_group_based_author_may_what_the_group_may_and_answers_are_kept_per_group_set() -> None:
    reviews = Reviews()
    kube = cast(Kube, type("K", (), {"api": reviews})())
    acting = Acting(kube, cast(AccessReviews, None), lambda namespace, device: None)

    async def may_use(groups: list[str]) -> bool:
        return await acting._may_use(CAROL, groups, NS, ACCOUNT, "use")
    assert asyncio.run(may_use(HOUSEHOLD))
    assert not asyncio.run(may_use(["system:authenticated"])), "an answer for other groups is not reused"
    assert [groups for _, groups, _ in reviews.asked] == [HOUSEHOLD, ["system:authenticated"]]


def test_clients_write_the_authors_groups_and_a_restore_writes_the_restorers() -> None:
    put = spec_of({"service_account": ACCOUNT, "inputs": ["porch-sensor"], "condition": "true", "reason": "dark",
                   "actions": [{"device": "porch-light", "actuator": "brightness", "action": "set_value",
                                "value": 80}]}, CAROL, None, HOUSEHOLD)
    assert put.author_groups == HOUSEHOLD
    first, second = spec(AGENT, ["system:serviceaccounts", "system:authenticated"]), spec(AGENT, level=100)
    annotations = {k: v for k, v in replacing(first, second).items() if v is not None}
    restored, _ = restoring(second, annotations, CAROL, HOUSEHOLD)
    assert (restored.author, restored.author_groups) == (CAROL, HOUSEHOLD)
    # Without groups, the kept author's are not carried over (admission would refuse them as carol's).
    assert restoring(second, {PREVIOUS_SPEC_ANNOTATION: annotations[PREVIOUS_SPEC_ANNOTATION]}, CAROL)[0] \
        .author_groups is None


def test_the_rule_policy_binds_author_groups_to_the_writers_own_on_every_spec_change() -> None:
    (policy,) = [p for p in admission_policies()
                 if p["kind"] == "ValidatingAdmissionPolicy" and p["metadata"]["name"] == "corral-rule-writer"]
    (check,) = [v for v in policy["spec"]["validations"] if "object.spec.authorGroups" in v["expression"]]
    assert check["expression"].startswith("!variables.specChanged || !has(object.spec.authorGroups) || ")
    assert "spec.authorGroups must be exactly the groups you are authenticated with" in check["messageExpression"]
