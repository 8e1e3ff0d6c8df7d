"""The Intent decision: every code for its reason, checks in their order, approvals that must not count."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.api.pause import Paused, paused_of
from corral.contract.model import Contract
from corral.decide.approvals import ApprovalView, People
from corral.decide.decision import (
    PIPELINE,
    RECHECKED,
    DeviceFacts,
    Guards,
    IntentFacts,
    InterlockVerdict,
    Lease,
    Policy,
    decide,
    recheck,
)
from corral.decide.evidence import Evidence, Observation, Received
from corral.decide.idempotency import compare, params_hash

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
STARTED = NOW - timedelta(minutes=10)
CONTRACT = Contract.model_validate(
    {
        "device_id": "front-lock",
        "name": "Lock",
        "model": "corral-lock",
        "fw": "1.0.0",
        "sensors": [{"metric": "temperature", "unit": "°C", "range": {"min": -40, "max": 85}}],
        "actuators": [
            {"id": "bolt", "name": "Bolt", "type": "enum", "values": ["locked", "unlocked"], "action": "set_mode",
             "risk": "high", "level": "write"},
            {"id": "light", "name": "Light", "type": "bool", "action": "set_state", "risk": "low", "level": "write"},
            {"id": "firmware", "name": "Firmware", "type": "enum", "values": ["1.0.0", "1.1.0"],
             "action": "set_version", "risk": "high", "level": "config"},
        ],
    }
)
DEVICE = DeviceFacts(exists=True, device_id="front-lock", contract=CONTRACT, online=True)
UID = "5f0c3a52-8e2b-4c1e-9a55-0d4c2f6b7e19"
HASH = "a" * 64


def intent(**changes: object) -> IntentFacts:
    base = IntentFacts(uid=UID, name="unlock-1", device="front-lock", actuator="light", action="set_state",
                       value=True, requester="agent", created_at=NOW - timedelta(seconds=1))
    return replace(base, **changes)


def approval(**changes: object) -> ApprovalView:
    base = ApprovalView(name="ok-1", intent_uid=UID, params_hash=HASH, decision="Approve", approver="alice",
                        approver_may_approve=True, created_at=NOW - timedelta(seconds=10))
    return replace(base, **changes)


def received(*samples: tuple[int, float], device_id: str = "front-lock", metric: str = "temperature") -> Evidence:
    """Buffers holding these (device ts, controller receive time in ms) samples, the last one the freshest."""
    cited = {(device_id, metric, ts): Received(ts, at, 21.5) for ts, at in samples}
    freshest = {(device_id, metric): Received(*samples[-1], 21.5)} if samples else {}
    return Evidence(cited, freshest, since=STARTED)


# A sample the device stamped 137 ms before it arrived (device clocks drift), received 0.5 s ago.
SAMPLE_TS = NOW_MS - 637
FRESH = received((SAMPLE_TS, NOW_MS - 500))


def run(i: IntentFacts, device: DeviceFacts = DEVICE, may: bool = True, approvals: list[ApprovalView] | None = None,
        policy: Policy | None = None, evidence: Evidence = FRESH):
    return decide(i, device, may, approvals or [], HASH, NOW, policy or Policy(), evidence=evidence)


def test_a_valid_low_risk_write_executes_without_approval() -> None:
    decision = run(intent())
    assert (decision.outcome, decision.code, decision.value, decision.risk, decision.level) == (
        "execute", None, True, "low", "write")


@pytest.mark.parametrize(
    ("facts", "code", "message"),
    [
        (dict(device=replace(DEVICE, exists=False)), "DEVICE_GONE", "does not exist"),
        (dict(device=replace(DEVICE, contract=None)), "DEVICE_GONE", "has no accepted contract"),
        (dict(i=intent(actuator="siren")), "DENY_UNKNOWN_ACTION", "no actuator 'siren'. Actions it offers: bolt: set_mode"),
        (dict(i=intent(action="set_mode")), "DENY_UNKNOWN_ACTION", "is set with set_state, not set_mode"),
        (dict(i=intent(value="on")), "DENY_ARGUMENTS", 'takes true or false; got "on"'),
        (dict(may=False), "DENY_SCOPE", "agent may not write device front-lock"),
        (dict(i=intent(based_on=(Observation("temperature", SAMPLE_TS),)), evidence=received((SAMPLE_TS, NOW_MS - 5000))),
         "DENY_SENSOR", "was received 5.0 s ago"),
        (dict(i=intent(based_on=(Observation("temperature", NOW_MS - 137),))), "DENY_SENSOR",
         f"at ts={NOW_MS - 137} is not a sample the controller received. The freshest sample the controller has is "
         f"ts={SAMPLE_TS} (value 21.5, received 0.5 s ago)"),
        (dict(i=intent(based_on=(Observation("temperature", 1.5),))), "DENY_SENSOR", "no valid timestamp"),
        (dict(i=intent(based_on=(Observation("pressure", SAMPLE_TS),))), "DENY_SENSOR", "no sensor 'pressure'"),
        (dict(device=replace(DEVICE, online=False)), "DEVICE_GONE", "is offline; nothing was sent"),
    ],
)
def test_each_refusal_has_its_code_and_says_why(facts: dict, code: str, message: str) -> None:
    decision = run(facts.pop("i", intent()), **facts)
    assert (decision.outcome, decision.code) == ("final", code)
    assert message in decision.message


def test_checks_run_in_order_the_first_failure_decides() -> None:
    everything_wrong = intent(actuator="bolt", action="set_mode", value="ajar",
                              based_on=(Observation("temperature", 0),))
    offline = replace(DEVICE, online=False)
    assert run(everything_wrong, offline, may=False).code == "DENY_ARGUMENTS"
    assert run(replace(everything_wrong, value="unlocked"), offline, may=False).code == "DENY_SCOPE"
    assert run(replace(everything_wrong, value="unlocked"), offline).code == "DENY_SENSOR"
    fresh = replace(everything_wrong, value="unlocked", based_on=())
    assert run(fresh, offline).outcome == "await_approval"  # approval is asked before the device is checked
    assert run(fresh, offline, approvals=[approval()]).code == "DEVICE_GONE"


def test_high_risk_waits_for_approval_until_the_window_closes() -> None:
    waiting = run(intent(actuator="bolt", action="set_mode", value="unlocked"))
    assert waiting.outcome == "await_approval" and waiting.expires_at == NOW - timedelta(seconds=1) + timedelta(minutes=5)
    assert "corral approve unlock-1" in waiting.message
    expired = run(intent(actuator="bolt", action="set_mode", value="unlocked", created_at=NOW - timedelta(minutes=6)))
    assert (expired.code, "expired" in expired.message) == ("DENY_APPROVAL", True)


def test_a_dry_run_that_would_wait_says_so_without_sending_anyone_to_approve_it() -> None:
    dry = run(intent(actuator="bolt", action="set_mode", value="unlocked", dry_run=True))
    assert dry.outcome == "await_approval" and "a real request would wait for 1 approval(s)" in dry.message
    assert "corral approve" not in dry.message and "cannot be approved" in dry.message
    # The control: the same request for real names the command that approves it.
    assert "corral approve unlock-1" in run(intent(actuator="bolt", action="set_mode", value="unlocked")).message


def test_a_valid_approval_lets_it_execute_and_is_consumed() -> None:
    decision = run(intent(actuator="bolt", action="set_mode", value="unlocked"), approvals=[approval()])
    assert (decision.outcome, decision.approvals) == ("execute", ("ok-1",))


def test_a_deny_from_a_valid_approver_is_denied_by_approver() -> None:
    decision = run(intent(actuator="bolt", action="set_mode", value="unlocked"),
                   approvals=[approval(decision="Deny", reason="not while we are away")])
    assert (decision.code, decision.message) == ("DENIED_BY_APPROVER", "Denied by alice: not while we are away.")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(approver="agent"), "agent cannot decide on their own request"),
        (dict(intent_uid="11111111-2222-3333-4444-555555555555"), "it is for another Intent"),
        (dict(params_hash="b" * 64), "other parameters"),
        (dict(consumed=True), "already used"),
        (dict(approver_may_approve=False), "alice does not hold the 'approve' verb"),
        (dict(approver="system:serviceaccount:home:agent-2"), "a ServiceAccount outside corral-people"),
        (dict(approver="system:kube-controller-manager"), "a Kubernetes system identity"),
        (dict(created_at=NOW - timedelta(minutes=6)), "expired"),
        (dict(expires_at=NOW - timedelta(seconds=1)), "expired"),
        # An approval cannot extend itself past the policy's lifetime.
        (dict(created_at=NOW - timedelta(minutes=6), expires_at=NOW + timedelta(hours=1)), "expired"),
        # A denial that does not count does not end the request either.
        (dict(decision="Deny", approver="agent"), "agent cannot decide on their own request"),
        (dict(decision="Deny", params_hash="b" * 64), "other parameters"),
    ],
)
def test_an_approval_that_does_not_count_is_refused_and_the_intent_keeps_waiting(bad: dict, message: str) -> None:
    lock = intent(actuator="bolt", action="set_mode", value="unlocked")
    decision = run(lock, approvals=[approval(name="bad-1", **bad)])
    assert decision.outcome == "await_approval" and message in decision.message
    assert [(r.approval, message in r.reason) for r in decision.refused] == [("bad-1", True)]
    # ... and a valid approval after it counts; the refused one is still reported, to be marked so.
    then = run(lock, approvals=[approval(name="bad-1", **bad), approval(created_at=NOW - timedelta(seconds=5))])
    assert (then.outcome, then.approvals, [r.approval for r in then.refused]) == ("execute", ("ok-1",), ["bad-1"])


def test_a_request_whose_window_closes_with_only_refused_approvals_ends_deny_approval_saying_it_expired() -> None:
    late = intent(actuator="bolt", action="set_mode", value="unlocked", created_at=NOW - timedelta(minutes=5))
    decision = run(late, approvals=[approval(approver="agent")])
    assert decision.code == "DENY_APPROVAL" and "it expired" in decision.message
    assert "cannot decide on their own request" in decision.message and len(decision.refused) == 1


def test_people_are_users_and_service_accounts_of_the_people_namespace_or_named_ones() -> None:
    people = People(namespace="corral-people", also=frozenset({"system:serviceaccount:ops:pager"}))
    assert people.includes("alice") and people.includes("oidc:alice@example.com")
    assert people.includes("system:serviceaccount:corral-people:alice")
    assert people.includes("system:serviceaccount:ops:pager")
    assert not people.includes("system:serviceaccount:home:agent")
    assert not people.includes("system:serviceaccount:corral-people")  # not a ServiceAccount name at all
    assert not people.includes("system:anonymous") and not people.includes("system:node:pi")
    other = Policy(people=People(namespace="household"))
    lock = intent(actuator="bolt", action="set_mode", value="unlocked")
    sa = approval(approver="system:serviceaccount:household:bob")
    assert run(lock, approvals=[sa], policy=other).outcome == "execute"
    assert run(lock, approvals=[sa]).outcome == "await_approval"


def test_a_withdrawn_intent_ends_cancelled_before_anything_else_and_again_right_before_it_runs() -> None:
    withdrawn = intent(actuator="bolt", action="set_mode", value="unlocked", cancelled="changed my mind")
    decision = run(withdrawn, approvals=[approval()])
    assert (decision.code, decision.outcome) == ("CANCELLED", "final")
    assert "changed my mind" in decision.message and "nothing was executed" in decision.message
    assert run(replace(withdrawn, device="gone"), DeviceFacts(False, None, None, None)).code == "CANCELLED"
    found = recheck(withdrawn, DEVICE, True, NOW)
    assert found is not None and found.code == "CANCELLED"


def test_critical_risk_can_require_two_distinct_approvers() -> None:
    policy = Policy(approvals_required={"low": 0, "medium": 1, "high": 2, "critical": 2})
    one = run(intent(actuator="bolt", action="set_mode", value="unlocked"), approvals=[approval()], policy=policy)
    same_twice = run(intent(actuator="bolt", action="set_mode", value="unlocked"), policy=policy,
                     approvals=[approval(), approval(name="ok-2")])
    two = run(intent(actuator="bolt", action="set_mode", value="unlocked"), policy=policy,
              approvals=[approval(), approval(name="ok-2", approver="bob")])
    assert one.outcome == same_twice.outcome == "await_approval"
    assert (two.outcome, set(two.approvals)) == ("execute", {"ok-1", "ok-2"})


def test_config_level_actions_need_the_config_verb() -> None:
    decision = run(intent(actuator="firmware", action="set_version", value="1.1.0"), may=False)
    assert decision.code == "DENY_SCOPE" and "'config' verb" in decision.message


def test_idempotency_same_request_is_dedup_and_a_reused_name_is_a_conflict() -> None:
    spec = {"device": "lamp", "actuator": "power", "action": "set_state", "params": {"value": 16},
            "reason": "dark", "requester": "agent"}
    assert compare(spec, {**spec, "reason": "it is dark"}) == "DEDUP"
    assert compare(spec, {**spec, "params": {"value": 16.0}}) == "DEDUP"
    assert compare(spec, {**spec, "params": {"value": 17}}) == "DENY_ID_CONFLICT"
    assert compare(spec, {**spec, "requester": "someone-else"}) == "DENY_ID_CONFLICT"
    assert params_hash("home", spec) == params_hash("home", {**spec, "requester": "x", "reason": "y"})
    assert params_hash("home", spec) != params_hash("lab", spec)


values = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8), st.none())


@given(
    actuator=st.sampled_from(["bolt", "light", "firmware", "siren"]),
    action=st.sampled_from(["set_mode", "set_state", "set_version", "toggle"]),
    value=values,
    may=st.booleans(),
    online=st.booleans() | st.none(),
    age_ms=st.floats(min_value=-5000, max_value=10_000) | st.none(),
    with_approval=st.booleans(),
)
def test_every_input_gets_exactly_one_outcome_and_only_safe_ones_execute(
    actuator: str, action: str, value: object, may: bool, online: bool | None, age_ms: float | None,
    with_approval: bool,
) -> None:
    based_on = () if age_ms is None else (Observation("temperature", SAMPLE_TS),)
    evidence = received((SAMPLE_TS, NOW_MS - (age_ms or 0)))
    decision = run(intent(actuator=actuator, action=action, value=value, based_on=based_on),
                   replace(DEVICE, online=online), may=may, approvals=[approval()] if with_approval else [],
                   evidence=evidence)
    assert (decision.outcome == "final") == (decision.code is not None)
    assert decision.message
    if decision.outcome == "execute":
        target = CONTRACT.actuator(actuator)
        assert target is not None and target.action == action and may and online
        assert age_ms is None or age_ms <= 2000
        assert target.risk == "low" or with_approval


def test_a_read_needs_the_read_verb_and_an_online_device_but_no_approval() -> None:
    read = intent(actuator="bolt", action="read", value=None)
    assert run(read).outcome == "execute" and run(read).level == "read"
    assert run(intent(actuator="temperature", action="read", value=None)).outcome == "execute"
    assert run(read, may=False).code == "DENY_SCOPE"
    assert run(read, replace(DEVICE, online=False)).code == "DEVICE_GONE"
    unknown = run(intent(actuator="pressure", action="read", value=None))
    assert unknown.code == "DENY_UNKNOWN_ACTION" and "Readable: bolt, light, firmware, temperature" in unknown.message


AGENT = "system:serviceaccount:home:agent"  # a program: a pause stops it ("agent" alone would be a User, a person)
PAUSED = Paused("home", "alice", "the basement is flooded", NOW - timedelta(minutes=2))
GUARDED = Guards(paused=PAUSED, hold="its new contract lowers the risk of bolt; a person must accept it",
                 interlocks=(InterlockVerdict("no-unlock-at-night", False, "it is night"),),
                 lease=Lease("system:serviceaccount:home:other-agent", NOW + timedelta(minutes=3), "cleaning"))


def test_the_pipeline_order_is_pinned_for_the_whole_product() -> None:
    assert [c.name for c in PIPELINE] == [
        "withdrawn", "rate limit", "device known", "action known", "arguments", "hold", "RBAC verb", "agents paused",
        "contract hold", "interlocks", "lease", "cited readings", "approval", "device online"]
    assert {"withdrawn", "RBAC verb", "agents paused", "contract hold", "interlocks", "lease"} == RECHECKED


def test_the_safety_envelope_is_checked_in_its_order_after_scope_and_before_readings() -> None:
    stale = intent(based_on=(Observation("temperature", NOW_MS - 60_000),), requester=AGENT)
    codes = []
    guards = GUARDED
    no_wait = Policy(hold_window=timedelta(0))  # a held device's request is denied at once
    for lift in ("paused", "hold", "interlocks", "lease"):
        codes.append(decide(stale, DEVICE, True, [], HASH, NOW, no_wait, guards).code)
        guards = replace(guards, **{lift: {"paused": None, "hold": None, "interlocks": (), "lease": None}[lift]})
    codes.append(decide(stale, DEVICE, True, [], HASH, NOW, no_wait, guards).code)
    assert codes == ["DENY_PAUSED", "DENY_CONTRACT_HOLD", "DENY_INTERLOCK", "DENY_LEASED", "DENY_SENSOR"]
    assert decide(stale, DEVICE, False, [], HASH, NOW, Policy(), GUARDED).code == "DENY_SCOPE", "scope comes first"
    held = decide(intent(), DEVICE, True, [], HASH, NOW, no_wait, replace(GUARDED, paused=None))
    assert "a person must accept it" in held.message


def test_a_request_on_a_held_device_waits_for_acceptance_then_is_denied() -> None:
    held = Guards(hold="actuator bolt: risk lowered (high -> low)")
    policy = Policy(hold_window=timedelta(seconds=30))
    waiting = decide(intent(), DEVICE, True, [], HASH, NOW, policy, held)
    assert (waiting.outcome, waiting.code) == ("await_hold", None)
    assert waiting.expires_at == intent().created_at + timedelta(seconds=30)
    assert "corral devices accept-contract front-lock" in waiting.message and "risk lowered" in waiting.message
    late = decide(intent(), DEVICE, True, [], HASH, NOW + timedelta(seconds=30), policy, held)
    assert late.code == "DENY_CONTRACT_HOLD" and "nobody accepted its changed contract within 30 s" in late.message
    assert decide(intent(), DEVICE, True, [], HASH, NOW, policy).outcome == "execute", "accepted: no wait"
    # Held after an approval, right before running: denied, never run on a contract nobody accepted.
    assert recheck(intent(), DEVICE, True, NOW, held).code == "DENY_CONTRACT_HOLD"
    blocked = decide(intent(), DEVICE, True, [], HASH, NOW, Policy(), Guards(interlocks=GUARDED.interlocks))
    assert "Interlock no-unlock-at-night forbids this now: it is night" in blocked.message


def test_a_lease_binds_others_only_and_only_until_it_expires() -> None:
    mine = Guards(lease=Lease("agent", NOW + timedelta(minutes=3)))
    expired = Guards(lease=Lease("someone-else", NOW - timedelta(seconds=1)))
    assert decide(intent(), DEVICE, True, [], HASH, NOW, Policy(), mine).outcome == "execute"
    assert decide(intent(), DEVICE, True, [], HASH, NOW, Policy(), expired).outcome == "execute"


def test_what_can_change_while_a_request_waits_is_checked_again_before_it_runs() -> None:
    approved = intent(actuator="bolt", action="set_mode", value="unlocked")
    assert run(approved, approvals=[approval()]).outcome == "execute"
    assert recheck(approved, DEVICE, True, NOW) is None
    assert recheck(approved, DEVICE, False, NOW).code == "DENY_SCOPE", "the grant was revoked meanwhile"
    assert recheck(replace(approved, requester=AGENT), DEVICE, True, NOW, Guards(paused=PAUSED)).code == "DENY_PAUSED"
    assert recheck(approved, replace(DEVICE, contract=None), True, NOW).code == "DEVICE_GONE"
    stale = replace(approved, based_on=(Observation("temperature", NOW_MS - 60_000),))
    assert recheck(stale, DEVICE, True, NOW) is None, "readings were judged when it was decided"


def test_a_pause_stops_every_requester_that_is_not_a_person_and_says_who_why_since_when_and_how_to_resume() -> None:
    paused = Guards(paused=PAUSED)
    agent = intent(requester=AGENT)
    denied = decide(agent, DEVICE, True, [], HASH, NOW, Policy(), paused)
    assert (denied.outcome, denied.code) == ("final", "DENY_PAUSED")
    assert denied.message == (
        "Agents are paused in namespace home since 2026-11-30 11:58:00 UTC by alice: the basement is flooded. "
        f"{AGENT} is not a person, so nothing was done. Nothing an agent asks for there runs until a person "
        "resumes agents (corral agents resume -n home).")
    # People keep control: a User, and a ServiceAccount of the people namespace (the policy's, not a default).
    people = Policy(people=People(namespace="household"))
    for person in ("alice", "system:serviceaccount:household:bob"):
        assert decide(intent(requester=person), DEVICE, True, [], HASH, NOW, people, paused).outcome == "execute"
    for program in (AGENT, "system:serviceaccount:corral-people:bob", "system:kube-controller-manager"):
        assert decide(intent(requester=program), DEVICE, True, [], HASH, NOW, people, paused).code == "DENY_PAUSED"
    # It is checked again right before anything runs, with the same notion of a person.
    assert recheck(agent, DEVICE, True, NOW, paused).code == "DENY_PAUSED"
    assert recheck(intent(requester="system:serviceaccount:household:bob"), DEVICE, True, NOW, paused, people) is None
    # Resumed: the agent acts again. The overlay is paused too; a read changes nothing and is not.
    assert decide(agent, DEVICE, True, [], HASH, NOW, Policy(), Guards()).outcome == "execute"
    alias = intent(requester=AGENT, action="set_alias", actuator="alias", value="Front door")
    assert decide(alias, DEVICE, True, [], HASH, NOW, Policy(), paused).code == "DENY_PAUSED"
    read = intent(requester=AGENT, action="read", actuator="bolt", value=None)
    assert decide(read, DEVICE, True, [], HASH, NOW, Policy(), paused).outcome == "execute"
    # Without a time or a reason the sentence still reads.
    bare = Guards(paused=Paused("home", "alice"))
    assert decide(agent, DEVICE, True, [], HASH, NOW, Policy(), bare).message.startswith(
        f"Agents are paused in namespace home by alice. {AGENT} is not a person")


def test_a_pause_is_read_from_the_agentpause_object_leniently_and_fails_safe() -> None:
    body = {"metadata": {"name": "agents", "namespace": "home"},
            "spec": {"paused": True, "reason": "leak", "by": "alice", "since": "2026-11-30T11:58:00Z"}}
    assert paused_of(body) == Paused("home", "alice", "leak", datetime(2026, 11, 30, 11, 58, tzinfo=UTC))
    assert paused_of({**body, "spec": {**body["spec"], "paused": False}}) is None
    assert paused_of(None) is None and paused_of({"metadata": {}, "spec": {}}) is None
    # A field it cannot read does not lift a pause.
    odd = paused_of({**body, "spec": {"paused": True, "since": "yesterday"}})
    assert odd == Paused("home", "someone", "", None)


def test_a_cited_reading_is_judged_by_when_the_controller_received_that_very_sample() -> None:
    cite = intent(based_on=(Observation("temperature", SAMPLE_TS),))
    # The freshness window is measured with the controller's clock, whatever the device's ts says.
    assert run(cite, evidence=received((SAMPLE_TS, NOW_MS - 2000))).outcome == "execute", "just inside"
    outside = run(cite, evidence=received((SAMPLE_TS, NOW_MS - 2001)))
    assert outside.code == "DENY_SENSOR" and "received 2.0 s ago" in outside.message, "just outside"
    skewed = intent(based_on=(Observation("temperature", NOW_MS - 3_600_000),))  # a device clock an hour behind
    assert run(skewed, evidence=received((NOW_MS - 3_600_000, NOW_MS - 300))).outcome == "execute"


def test_a_ts_that_never_arrived_is_refused_naming_the_freshest_sample_instead() -> None:
    newest = NOW_MS - 900
    invented = intent(based_on=(Observation("temperature", NOW_MS - 137),))
    decision = run(invented, evidence=received((NOW_MS - 5000, NOW_MS - 4000), (newest, NOW_MS - 800)))
    assert decision.code == "DENY_SENSOR"
    assert f"ts={NOW_MS - 137} is not a sample the controller received" in decision.message
    assert f"freshest sample the controller has is ts={newest} (value 21.5, received 0.8 s ago)" in decision.message
    other = intent(based_on=(Observation("temperature", SAMPLE_TS, device_id="hall-sensor"),))
    assert run(other).code == "DENY_SENSOR", "a sample of one device is no evidence about another"


def test_after_a_restart_the_empty_buffers_deny_and_say_why() -> None:
    decision = run(intent(based_on=(Observation("temperature", SAMPLE_TS),)), evidence=received())
    assert decision.code == "DENY_SENSOR"
    assert f"No sample of front-lock/temperature has arrived since the controller started at {STARTED:%H:%M:%S} UTC" \
        in decision.message
    assert "a restarted controller has none until the device sends again" in decision.message
