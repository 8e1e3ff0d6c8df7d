"""A Rule's revisions, pure: what a replacement keeps, that restoring twice toggles, who makes a revision act, which
grants an edit voids, a voided grant covering nothing, the gateway's reading of iot.rules.put and which Rule tools
a caller sees."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from corral.api.intent import AuditCitation
from corral.api.policies import admission_policies
from corral.api.rule import ACCEPTED_ANNOTATION, PREVIOUS_SPEC_ANNOTATION, Rule, RuleSpec
from corral.audit.log import AuditLog
from corral.decide.approvals import DEFAULT_PEOPLE
from corral.decide.grants import GrantView, covering, why_not_covered
from corral.decide.revisions import (
    acceptance,
    diff,
    previous_spec,
    previous_spec_hash,
    replacing,
    restoring,
    spec_hash,
    voids,
)
from corral.gateway.access import Access, NamespaceAccess
from corral.gateway.access import Rule as RbacRule
from corral.gateway.tools.arguments import ArgumentError
from corral.gateway.tools.rules import rule_tools, spec_of
from corral.gateway.view import CallerView
from corral.kube.objects import Kube
from corral.reconcile.rules.revisions import Revisions

AGENT = "system:serviceaccount:home:agent"
PERSON = "alice"
NOW = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)


def spec(level: int = 80, author: str = AGENT, account: str = "porch-rule") -> RuleSpec:
    return RuleSpec.model_validate({
        "serviceAccountName": account, "author": author, "inputs": ["porch-sensor"],
        "condition": 'readings["porch-sensor"]["lux"] < 10.0', "for": "2s", "reason": "dark",
        "actions": [{"device": "porch-light", "actuator": "brightness", "action": "set_value", "value": level}]})


def test_a_replacement_keeps_the_spec_it_replaces_and_restoring_twice_toggles() -> None:
    first, second = spec(80), spec(100)
    assert replacing(None, first) == {}, "a first revision keeps nothing"
    assert replacing(first, first) == {}, "an unchanged spec is no revision"
    annotations = {k: v for k, v in replacing(first, second).items() if v is not None}
    assert previous_spec(annotations) == first and previous_spec_hash(annotations) == spec_hash(first)
    restored, kept = restoring(second, annotations, PERSON)
    assert restored.actions[0].value == 80 and restored.author == PERSON
    back, kept_again = restoring(restored, {PREVIOUS_SPEC_ANNOTATION: kept}, PERSON)
    assert back.actions[0].value == 100 and previous_spec({PREVIOUS_SPEC_ANNOTATION: kept_again}) == restored
    with pytest.raises(ValueError, match="no previous revision"):
        restoring(first, {}, PERSON)
    with pytest.raises(ValueError, match="no previous revision"):
        restoring(first, {PREVIOUS_SPEC_ANNOTATION: "{not json"}, PERSON)
    # A kept annotation that is no spec is still accounted for: its text's hash, not silence.
    assert previous_spec_hash({PREVIOUS_SPEC_ANNOTATION: "{not json"}) is not None


def test_a_revision_acts_when_a_person_wrote_it_or_accepted_exactly_this_generation() -> None:
    assert acceptance(spec(author=PERSON), 4, {}, DEFAULT_PEOPLE).acts
    waiting = acceptance(spec(), 4, {}, DEFAULT_PEOPLE)
    assert not waiting.acts and "corral rules accept" in waiting.why
    assert acceptance(spec(), 4, {ACCEPTED_ANNOTATION: f"4:{PERSON}"}, DEFAULT_PEOPLE).by == PERSON
    assert not acceptance(spec(), 5, {ACCEPTED_ANNOTATION: f"4:{PERSON}"}, DEFAULT_PEOPLE).acts, "an older revision's"
    assert not acceptance(spec(), 4, {ACCEPTED_ANNOTATION: f"4:{AGENT}"}, DEFAULT_PEOPLE).acts, "not a person"


def test_an_edit_after_the_first_voids_the_grants_to_the_rules_service_account_only() -> None:
    account = "system:serviceaccount:home:porch-rule"
    assert voids(2, "home", "porch-rule", account, already_voided=False)
    assert not voids(1, "home", "porch-rule", account, already_voided=False), "creating a Rule voids nothing"
    assert not voids(2, "home", "porch-rule", AGENT, already_voided=False)
    assert not voids(2, "other", "porch-rule", account, already_voided=False)
    assert not voids(3, "home", "porch-rule", account, already_voided=True)
    # A grant made after the controller saw the edit is a person's decision about the new revision; one made the same
    # second is voided (tests/unit/test_rule_authors.py has the backdated edit).
    seen = NOW + timedelta(milliseconds=400)
    assert not voids(2, "home", "porch-rule", account, False, NOW + timedelta(seconds=1), seen)
    assert voids(2, "home", "porch-rule", account, False, NOW, seen)
    assert voids(2, "home", "porch-rule", account, False, NOW + timedelta(seconds=1), None)


def grant(voided: str | None) -> GrantView:
    return GrantView(name="g", grantor=PERSON, grantor_may_approve=True, requester="rule", actuators=frozenset({"b"}),
                     uses=3, used=0, expires_at=NOW + timedelta(hours=1), devices=frozenset({"light"}),
                     minimum=0, maximum=100, voided=voided)


def test_a_voided_grant_covers_nothing_and_says_why() -> None:
    assert covering([grant(None)], "rule", "light", {}, "b", 50, "high", NOW) == [grant(None)]
    voided = grant("Rule dusk was edited (revision 2)")
    assert covering([voided], "rule", "light", {}, "b", 50, "high", NOW) == []
    assert "voided: Rule dusk was edited" in (why_not_covered(voided, "rule", "light", {}, "b", 50, "high", NOW) or "")


def test_the_diff_shows_what_changed() -> None:
    lines = diff(spec(80), spec(100))
    assert '-      "value": 80' in lines and '+      "value": 100' in lines
    assert diff(spec(80), spec(80)) == []


PUT: dict[str, Any] = {"name": "porch", "service_account": "porch-rule", "inputs": ["porch-sensor"],
                       "condition": "true", "for_s": 2, "cooldown_s": 60, "reason": "dark",
                       "actions": [{"device": "porch-light", "actuator": "brightness", "action": "set_value",
                                    "value": 80, "hold_for_s": 30}]}


def test_iot_rules_put_arguments_become_a_spec_in_the_callers_name() -> None:
    made = spec_of(PUT, AGENT, None)
    assert made.author == AGENT and made.for_ == "2s" and made.cooldown == "60s"
    assert made.actions[0].hold_for == "30s" and made.max_reading_age_seconds == 60
    kept = spec_of(PUT, AGENT, made.model_copy(update={"max_reading_age_seconds": 5}))
    assert kept.max_reading_age_seconds == 5, "a replacement keeps what the call does not set"
    with pytest.raises(ArgumentError, match="Not a valid Rule: inputs"):
        spec_of({**PUT, "inputs": []}, AGENT, None)
    with pytest.raises(ArgumentError, match="for_s must be a whole number"):
        spec_of({**PUT, "for_s": "soon"}, AGENT, None)


@dataclass
class View:
    namespaces: list[str]
    access: Access = field(default_factory=Access)


def test_the_rule_tools_follow_the_callers_rbac_on_rules() -> None:
    def names(*verbs: str) -> list[str]:
        rules = (RbacRule(frozenset(verbs), frozenset({"corral.dev"}), frozenset({"rules"}), frozenset()),)
        view = View(["home"], Access.of([NamespaceAccess("home", rules)]))
        return [tool.name for tool in rule_tools(cast(CallerView, view))]
    assert names() == []
    assert names("get", "list") == ["iot.rules.list", "iot.rules.get"]
    assert names("get", "list", "create", "update") == [
        "iot.rules.list", "iot.rules.get", "iot.rules.put", "iot.rules.restore"]


def test_the_rule_policy_checks_author_service_account_devices_and_acceptance() -> None:
    policy = next(p for p in admission_policies() if p["metadata"]["name"] == "corral-rule-writer"
                  and p["kind"] == "ValidatingAdmissionPolicy")
    expressions = json.dumps(policy["spec"])
    for needed in ("object.spec.author == request.userInfo.username", "check('impersonate')", "check('use')",
                   "check('write')", "check('approve')", "string(object.metadata.generation) + ':'"):
        assert needed in expressions, needed


def test_a_revision_observed_before_a_restart_is_not_recorded_or_voided_again() -> None:
    """The status says this generation was observed, with its record: observe touches neither log nor grants."""
    cited = AuditCitation(seq=7, hash="a" * 64)
    rule = Rule.model_validate({
        "apiVersion": "corral.dev/v1alpha1", "kind": "Rule", "metadata": {"name": "dusk", "namespace": "home",
                                                                         "generation": 2},
        "spec": spec().model_dump(mode="json", by_alias=True),
        "status": {"observedGeneration": 2, "revisionAudit": cited.model_dump()}})
    revisions = Revisions(cast(Kube, None), cast(AuditLog, None))  # any I/O would fail on None
    assert asyncio.run(revisions.observe(rule)) == cited
