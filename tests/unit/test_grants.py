"""Standing grants, judged: what a grant covers, what it never covers, and how the decision spends one."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from corral.api.grant import ApprovalGrant
from corral.cli.main import cli
from corral.decide.approvals import People
from corral.decide.decision import Policy, decide
from corral.decide.grants import GrantView, covering, why_not_covered
from corral.decide.selectors import Selector
from tests.unit.test_decide import DEVICE, HASH, approval, intent

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
AGENT = "system:serviceaccount:home:agent"
GRANT = GrantView(name="cool-nights", grantor="alice", grantor_may_approve=True, requester=AGENT,
                  actuators=frozenset({"target_temp"}), uses=3, used=0, expires_at=NOW + timedelta(hours=1),
                  devices=frozenset({"bedroom-ac"}), minimum=18, maximum=24)


def why(grant: GrantView = GRANT, *, requester: str = AGENT, device: str = "bedroom-ac",
        labels: dict[str, str] | None = None, actuator: str = "target_temp", value: object = 21,
        risk: str = "medium") -> str | None:
    return why_not_covered(grant, requester, device, labels or {}, actuator, value, risk, NOW)


def test_a_grant_covers_its_requester_device_actuator_and_range_both_ends_included() -> None:
    assert why(value=18) is None and why(value=24) is None and why(value=21.5) is None


@pytest.mark.parametrize(("change", "reason"), [
    ({"value": 24.5}, "does not cover the value 24.5"),
    ({"value": True}, "does not cover the value true"),  # a bool is no number here
    ({"value": "21"}, "does not cover the value \"21\""),
    ({"requester": "system:serviceaccount:home:other"}, f"it is for {AGENT}"),
    ({"device": "kitchen-ac"}, "does not cover Device kitchen-ac"),
    ({"actuator": "mode"}, "does not cover actuator mode"),
    ({"risk": "critical"}, "critical-risk actions are never granted"),
])
def test_what_a_grant_does_not_cover(change: dict[str, object], reason: str) -> None:
    found = why(**change)
    assert found is not None and reason in found


@pytest.mark.parametrize(("grant", "reason"), [
    (replace(GRANT, used=3), "all 3 uses are consumed"),
    (replace(GRANT, expires_at=NOW), "it expired"),
    (replace(GRANT, grantor_may_approve=False), "no longer holds the 'approve' verb"),
    (replace(GRANT, grantor="system:serviceaccount:home:agent-2"), "is not a person"),
    (replace(GRANT, grantor=AGENT), "is not a person other than the requester"),
])
def test_a_grant_used_up_expired_or_of_someone_who_may_no_longer_approve_covers_nothing(grant: GrantView,
                                                                                        reason: str) -> None:
    found = why(grant)
    assert found is not None and reason in found


def test_devices_by_label_and_listed_values_compare_as_the_contract_does() -> None:
    by_label = replace(GRANT, devices=frozenset(), selector=Selector({"room": "bedroom"}), minimum=None, maximum=None,
                       values=(True,), actuators=frozenset({"power"}))
    assert why(by_label, labels={"room": "bedroom"}, actuator="power", value=True) is None
    assert why(by_label, labels={"room": "hall"}, actuator="power", value=True) is not None
    assert why(by_label, labels={"room": "bedroom"}, actuator="power", value=1) is not None  # 1 is not true


def test_a_grant_that_does_not_say_what_it_covers_covers_nothing() -> None:
    """Admission refuses such grants; one made before that rule (an empty selector, no values, no range) is no
    blank cheque for the controller either."""
    by_label = replace(GRANT, devices=frozenset(), selector=Selector({"room": "bedroom"}), minimum=None, maximum=None,
                       values=(True,), actuators=frozenset({"power"}))
    assert why(by_label, labels={"room": "bedroom"}, actuator="power", value=True) is None  # positive control
    found = why(replace(by_label, values=()), labels={"room": "bedroom"}, actuator="power", value=False)
    assert found == "it does not cover the value false"
    found = why(replace(by_label, selector=Selector()), labels={"room": "bedroom"}, actuator="power", value=True)
    assert found == "it does not cover Device bedroom-ac"


def test_of_several_covering_grants_the_one_expiring_first_is_spent_first() -> None:
    later = replace(GRANT, name="a-later", expires_at=NOW + timedelta(hours=2))
    spent_up = replace(GRANT, name="b-spent", used=3)
    found = covering([later, spent_up, GRANT], AGENT, "bedroom-ac", {}, "target_temp", 20, "medium", NOW, People())
    assert [g.name for g in found] == ["cool-nights", "a-later"]


LOCK_INTENT = intent(actuator="bolt", action="set_mode", value="unlocked", requester=AGENT,
                           created_at=NOW - timedelta(seconds=1))
LOCK_GRANT = replace(GRANT, actuators=frozenset({"bolt"}), devices=frozenset({"front-lock"}), minimum=None,
                     maximum=None, values=("unlocked",))


def test_a_covering_grant_lets_a_request_that_needs_approval_run_and_names_the_grant() -> None:
    decision = decide(LOCK_INTENT, DEVICE, True, [], HASH, NOW, Policy(), grants=[LOCK_GRANT])
    assert (decision.outcome, decision.grant, decision.approvals) == ("execute", "cool-nights", ())
    # Without it, or outside it, the request waits for a person as before.
    assert decide(LOCK_INTENT, DEVICE, True, [], HASH, NOW, Policy()).outcome == "await_approval"
    locked = replace(LOCK_INTENT, value="locked")
    assert decide(locked, DEVICE, True, [], HASH, NOW, Policy(), grants=[LOCK_GRANT]).outcome == "await_approval"


def test_a_valid_approval_is_used_before_a_grant_and_a_low_risk_action_spends_nothing() -> None:
    approved = decide(LOCK_INTENT, DEVICE, True, [approval()], HASH, NOW, Policy(), grants=[LOCK_GRANT])
    assert (approved.outcome, approved.grant, approved.approvals) == ("execute", None, ("ok-1",))
    light = replace(LOCK_INTENT, actuator="light", action="set_state", value=True)
    any_light = replace(LOCK_GRANT, actuators=frozenset({"light"}), values=())
    assert decide(light, DEVICE, True, [], HASH, NOW, Policy(), grants=[any_light]).grant is None


def test_a_grant_does_not_lift_any_other_check() -> None:
    denied = decide(LOCK_INTENT, DEVICE, False, [], HASH, NOW, Policy(), grants=[LOCK_GRANT])
    assert denied.code == "DENY_SCOPE"
    offline = decide(LOCK_INTENT, replace(DEVICE, online=False), True, [], HASH, NOW, Policy(),
                     grants=[LOCK_GRANT])
    assert offline.code == "DEVICE_GONE"


@pytest.mark.parametrize("bounds,expected", [
    (["--device", "front-door-lock"], "a grant must say which values it covers: --value JSON (repeatable) or --range"),
    (["--value", "true"], "a grant must say which Devices it covers: --device NAME (repeatable) or --selector"),
])
def test_corral_grants_create_says_what_a_grant_must_name_before_asking_the_cluster(
        tmp_path: Path, bounds: list[str], expected: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # a cluster nobody answers at: the refusal comes first
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                          "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
                          "users: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
    result = CliRunner().invoke(cli, ["grants", "create", AGENT, "--kubeconfig", str(kubeconfig), "--actuator", "locked",
                                      "--uses", "3", *bounds])
    assert result.exit_code == 2 and expected in result.output
    # Positive control: with both it gets as far as the cluster (which does not answer here).
    both = CliRunner().invoke(cli, ["grants", "create", AGENT, "--kubeconfig", str(kubeconfig), "--actuator", "locked",
                                    "--uses", "3", "--device", "front-door-lock", "--value", "true"])
    assert "a grant must say" not in both.output


def test_the_model_refuses_a_grant_that_does_not_say_what_it_covers() -> None:
    """The same rules as the API server's, for corral grants create and anyone validating a manifest."""
    base = {"apiVersion": "corral.dev/v1alpha1", "kind": "ApprovalGrant", "metadata": {"name": "g"},
            "spec": {"grantor": "alice", "requester": AGENT, "actuators": ["locked"], "uses": 1,
                     "expiresAt": "2030-01-01T00:00:00Z"}}
    for bounds, expected in (({"selector": {}, "values": [True]}, "which Devices"),
                             ({"devices": ["front-door-lock"]}, "which values")):
        with pytest.raises(ValidationError, match=f"a grant must say {expected} it covers"):
            ApprovalGrant.model_validate({**base, "spec": {**base["spec"], **bounds}})
    ApprovalGrant.model_validate({**base, "spec": {**base["spec"], "selector": {"matchLabels": {"room": "hall"}},
                                                   "values": [True]}})  # positive control
