"""Rules judged without a cluster: every verdict in its order, staleness that names what, `for` and the cooldown
with the clock injected, when to look again, and who a revision's author must be for it to act."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from corral.api.rule import ACCEPTED_ANNOTATION, Rule, RuleSpec
from corral.decide.approvals import People
from corral.decide.evidence import Received
from corral.decide.rules import InputFacts, Memory, accepted, agent_written, compile_condition, judge

NOW = datetime(2026, 12, 3, 7, 0, 0, tzinfo=UTC)
NOW_MS = NOW.timestamp() * 1000
PROBE = "leak-probe"


def spec(condition: str = f'readings["{PROBE}"]["wet"]', **fields: Any) -> RuleSpec:
    body: dict[str, Any] = {"serviceAccountName": "leak-rule", "author": "alice", "inputs": [PROBE],
                            "condition": condition, "for": "2s", "cooldown": "1m", "maxReadingAgeSeconds": 5,
                            "actions": [{"device": "valve", "actuator": "open", "action": "set_state",
                                         "value": False}], "reason": "close the valve on a leak"}
    body.update(fields)
    return RuleSpec.model_validate(body)


def probe(wet: object = True, age_s: float = 1.0, online: bool | None = True, exists: bool = True) -> dict[str, InputFacts]:
    latest = {"wet": Received(ts=1, received_ms=NOW_MS - age_s * 1000, value=wet)}
    return {PROBE: InputFacts(PROBE, exists, online, {}, latest)}


def run(s: RuleSpec, inputs: dict[str, InputFacts], memory: Memory | None = None, now: datetime = NOW) -> Any:
    return judge(compile_condition("leak", s), s, inputs, memory or Memory(), now)


def test_a_condition_that_does_not_compile_is_invalid() -> None:
    result = run(spec("readings["), probe())
    assert result.verdict == "Invalid" and "does not compile" in result.message


def test_a_condition_that_is_not_a_boolean_is_invalid() -> None:
    assert run(spec("1 + 2"), probe()).verdict == "Invalid"


def test_a_type_error_at_evaluation_is_invalid_not_stale() -> None:
    result = run(spec(f'readings["{PROBE}"]["wet"] > "a"'), probe(wet=True))
    assert result.verdict == "Invalid" and "could not be evaluated" in result.message


def test_false_is_idle_and_forgets_true_since() -> None:
    result = run(spec(), probe(wet=False), Memory(true_since=NOW - timedelta(seconds=10)))
    assert (result.verdict, result.true_since) == ("Idle", None)
    assert result.look_again_s is not None and 3.9 < result.look_again_s < 4.2  # when the reading ages out


def test_true_for_less_than_for_holds_and_looks_again_when_it_is_due() -> None:
    first = run(spec(), probe())
    assert (first.verdict, first.true_since) == ("Holding", NOW)
    assert first.look_again_s is not None and 2.0 <= first.look_again_s < 2.2
    later = run(spec(), probe(), Memory(true_since=NOW - timedelta(seconds=1.5)))
    assert later.verdict == "Holding" and later.look_again_s is not None and later.look_again_s < 0.6


def test_true_for_long_enough_fires() -> None:
    result = run(spec(), probe(), Memory(true_since=NOW - timedelta(seconds=2)))
    assert result.verdict == "Fire" and result.true_since == NOW - timedelta(seconds=2)


def test_for_zero_fires_at_once() -> None:
    assert run(spec(**{"for": "0s"}), probe()).verdict == "Fire"


def test_within_the_cooldown_it_cools_down_and_looks_again_at_its_end() -> None:
    memory = Memory(true_since=NOW - timedelta(seconds=30), last_fired=NOW - timedelta(seconds=50))
    result = run(spec(), probe(), memory)
    assert result.verdict == "CoolingDown" and "10.0 s left" in result.message
    assert result.look_again_s is not None and result.look_again_s <= 4.2  # the reading ages out first
    after = run(spec(), probe(), Memory(true_since=memory.true_since, last_fired=NOW - timedelta(seconds=61)))
    assert after.verdict == "Fire"  # level-triggered: still true after the cooldown, it fires again


def test_flapping_within_the_cooldown_fires_once() -> None:
    memory, fired, now = Memory(), 0, NOW
    for i in range(20):
        now = NOW + timedelta(seconds=i * 2.5)
        wet = i % 2 == 0
        inputs = {PROBE: InputFacts(PROBE, True, True, {}, {"wet": Received(1, now.timestamp() * 1000, wet)})}
        result = run(spec(**{"for": "0s"}), inputs, memory, now)
        last_fired = memory.last_fired
        if result.verdict == "Fire":
            fired += 1
            last_fired = now
        memory = Memory(result.true_since, last_fired)
    assert fired == 1


def test_an_offline_input_is_stale_and_names_it() -> None:
    result = run(spec(), probe(online=False), Memory(true_since=NOW - timedelta(seconds=10)))
    assert (result.verdict, result.true_since) == ("Stale", None)
    assert result.stale == (f"input {PROBE} is offline",)


def test_a_missing_input_is_stale() -> None:
    result = run(spec(), probe(exists=False))
    assert result.verdict == "Stale" and "missing" in result.message


def test_a_reading_too_old_is_stale_not_false() -> None:
    result = run(spec(f'!readings["{PROBE}"]["wet"]'), probe(wet=False, age_s=9))
    assert result.verdict == "Stale" and "9.0 s" in result.message and "5 s" in result.message


def test_a_reading_never_sent_is_stale() -> None:
    s = spec()
    result = judge(compile_condition("leak", s), s, {PROBE: InputFacts(PROBE, True, True, {}, {})}, Memory(), NOW)
    assert result.verdict == "Stale" and "sent no reading" in result.message


def test_a_rule_that_allows_a_missing_reading_says_so_and_is_judged() -> None:
    s = spec(f'{PROBE!r} in readings && readings["{PROBE}"]["wet"]'.replace("'", '"'))
    assert run(s, probe(age_s=9)).verdict == "Idle"


def test_reported_state_is_in_the_environment() -> None:
    s = spec(f'devices["{PROBE}"]["reported"]["open"] == true')
    inputs = {PROBE: InputFacts(PROBE, True, True, {"open": True}, {})}
    assert judge(compile_condition("x", s), s, inputs, Memory(), NOW).verdict == "Holding"


def rule(author: str, annotation: str | None = None, generation: int = 3) -> Rule:
    annotations = {ACCEPTED_ANNOTATION: annotation} if annotation is not None else {}
    return Rule.model_validate({"apiVersion": "corral.dev/v1alpha1", "kind": "Rule",
                                "metadata": {"name": "leak", "namespace": "home", "generation": generation,
                                             "annotations": annotations},
                                "spec": {**spec().model_dump(mode="json", by_alias=True), "author": author}})


def test_a_persons_revision_is_accepted() -> None:
    people = People()
    assert accepted(rule("alice"), people) and not agent_written(rule("alice"), people)


def test_an_agents_revision_acts_only_once_a_person_accepted_that_generation() -> None:
    people, agent = People(), "system:serviceaccount:home:agent"
    assert agent_written(rule(agent), people) and not accepted(rule(agent), people)
    assert accepted(rule(agent, "3:alice"), people)
    assert not accepted(rule(agent, "2:alice"), people)  # an earlier generation's acceptance
    assert not accepted(rule(agent, f"3:{agent}"), people)  # a program accepting
    assert not accepted(rule(agent, "3:"), people)
