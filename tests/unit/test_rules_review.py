"""Accepting and restoring exactly what was shown (issue 41, findings 5 and 6), pure: a restore acts only on a kept
revision the controller recorded, an acceptance only on a recorded current revision, and the act is bound to the
revision shown (`--generation`, or typed at a terminal; anyone else is refused). The real API server and CLI replay
the attacks in tests/integration/test_rules_governance.py."""

from __future__ import annotations

from typing import Any

import click
import pytest

from corral.api.rule import PREVIOUS_SPEC_ANNOTATION, Rule, RuleSpec
from corral.cli import rule_review
from corral.decide.revisions import kept_annotation, spec_hash
from corral.decide.rules import current_on_record, recorded_as, restore_plan

AGENT = "system:serviceaccount:home:agent"


def spec(level: int, author: str = AGENT) -> RuleSpec:
    return RuleSpec.model_validate({
        "serviceAccountName": "porch-rule", "author": author, "inputs": ["porch-sensor"],
        "condition": 'readings["porch-sensor"]["lux"] < 10.0', "reason": "dark",
        "actions": [{"device": "porch-light", "actuator": "brightness", "action": "set_value", "value": level}]})


def rule(current: RuleSpec, generation: int, kept: RuleSpec | None, recorded: list[tuple[int, RuleSpec]]) -> Rule:
    annotations = {PREVIOUS_SPEC_ANNOTATION: kept_annotation(kept)} if kept is not None else {}
    revisions = [{"generation": g, "specHash": spec_hash(s), "author": s.author} for g, s in recorded]
    return Rule.model_validate({
        "apiVersion": "corral.dev/v1alpha1", "kind": "Rule",
        "metadata": {"name": "porch", "namespace": "home", "generation": generation, "annotations": annotations},
        "spec": current.model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": {"revisions": revisions}})


def test_a_restore_acts_only_on_a_kept_revision_the_controller_recorded() -> None:
    malicious, harmless = spec(100), spec(80)
    # The agent's own revisions, in turn: restoring puts back a real revision (shown to the person first).
    made = rule(harmless, 3, malicious, [(3, harmless), (2, malicious)])
    plan = restore_plan(made, "alice", ["people"])
    assert plan.revision.generation == 2 and plan.spec.actions[0].value == 100 and plan.spec.author == "alice"
    assert plan.spec.author_groups == ["people"] and recorded_as(made, plan.restored) == plan.revision
    # The annotation written directly (or with a trivial edit): a spec that never was the Rule's.
    forged = rule(harmless, 3, spec(0), [(3, harmless), (2, malicious)])
    with pytest.raises(ValueError, match="matches no revision the controller recorded"):
        restore_plan(forged, "alice")
    with pytest.raises(ValueError, match="no previous revision is kept"):
        restore_plan(rule(harmless, 1, None, [(1, harmless)]), "alice")


def test_an_acceptance_needs_the_current_revision_on_record() -> None:
    current = spec(80)
    assert current_on_record(rule(current, 4, None, [(4, current)])).generation == 4
    with pytest.raises(ValueError, match="revision 4 of Rule porch is not on record yet"):
        current_on_record(rule(current, 4, None, [(3, current.model_copy(update={"reason": "other"}))]))
    with pytest.raises(ValueError, match="not on record yet"):
        current_on_record(rule(current, 4, None, [(3, current)]))  # the same spec, recorded for another revision


def test_the_act_is_bound_to_the_revision_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[str] = []

    def prompt(text: str, **_: Any) -> str:
        return answers.pop(0)
    monkeypatch.setattr(click, "prompt", prompt)
    monkeypatch.setattr(rule_review, "interactive", lambda: False)
    rule_review.bind("porch", 4, 4, "accept")  # --generation as shown
    with pytest.raises(click.ClickException, match="at revision 5, not 4: it changed since you looked"):
        rule_review.bind("porch", 5, 4, "accept")
    with pytest.raises(click.ClickException, match="--generation is required when not interactive"):
        rule_review.bind("porch", 4, None, "accept")
    monkeypatch.setattr(rule_review, "interactive", lambda: True)
    answers[:] = ["4"]
    rule_review.bind("porch", 4, None, "restore")
    answers[:] = ["y"]
    with pytest.raises(click.ClickException, match="you typed 'y', not 4"):
        rule_review.bind("porch", 4, None, "restore")
