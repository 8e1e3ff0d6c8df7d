"""The requester's rate limit in the decision pipeline: judged from the Intents' creation times and outcomes,
so the answer is the same after a restart and whichever worker decides first."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from corral.cli.main import cli
from corral.decide.decision import decide
from corral.decide.ratelimit import RateLimit, Request, judge
from corral.reconcile.intents.ratelimits import RequestIndex
from tests.unit.test_decide import DEVICE, HASH, NOW, intent

LIMIT = RateLimit(30, timedelta(seconds=60))  # the gateway's default: 30 at once, one more every 2 s
AGENT = "system:serviceaccount:home:agent"


def intent_body(name: str, at_s: float, requester: str = AGENT, **spec: Any) -> dict[str, Any]:
    created = (NOW + timedelta(seconds=at_s)).replace(microsecond=0).isoformat()
    return {"metadata": {"namespace": "home", "name": name, "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"device": "front-lock", "actuator": "locked", "action": "set_state", "params": {"value": True},
                     "requester": requester, "reason": "test", **spec}}


def decide_in_order(bodies: list[dict[str, Any]], order: list[int], limit: RateLimit = LIMIT) -> dict[str, str]:
    """Decide each Intent as the controller would, in this order; what each ended as."""
    cache: dict[tuple[str, str], dict[str, Any]] = {}
    index = RequestIndex(limit, cache.get)
    for body in bodies:
        cache[("home", body["metadata"]["name"])] = body
        index.observe("ADDED", body)
    outcome = {}
    for i in order:
        body = bodies[i]
        limited = index.verdict(body)
        code = "RATE_LIMITED" if limited else "EXECUTED"
        outcome[body["metadata"]["name"]] = code
        cache[("home", body["metadata"]["name"])] = {**body, "status": {"phase": "Denied" if limited else "Succeeded",
                                                                         "code": code}}
    return outcome


def test_sixty_at_once_from_one_agent_thirty_run_the_rest_are_rate_limited() -> None:
    bodies = [intent_body(f"req-{i:02d}", 0) for i in range(60)]
    outcome = decide_in_order(bodies, list(range(60)))
    assert list(outcome.values()).count("EXECUTED") == 30
    assert [n for n, c in outcome.items() if c == "EXECUTED"] == [f"req-{i:02d}" for i in range(30)]


def test_the_answer_does_not_depend_on_who_decides_first_or_on_a_restart() -> None:
    bodies = [intent_body(f"req-{i:02d}", i // 10) for i in range(60)]  # 10 a second for 6 s: 30 + 5 s refilled
    first = decide_in_order(bodies, list(range(60)))
    assert list(first.values()).count("EXECUTED") == 32
    shuffled = list(range(60))
    random.Random(7).shuffle(shuffled)
    assert decide_in_order(bodies, shuffled) == first
    # A restart with half of them decided: the other half come out as before.
    cache: dict[tuple[str, str], dict[str, Any]] = {}
    index = RequestIndex(LIMIT, cache.get)
    for i, body in enumerate(bodies):
        code = first[body["metadata"]["name"]]
        decided = {"status": {"phase": "Succeeded" if code == "EXECUTED" else "Denied", "code": code}} if i % 2 else {}
        cache[("home", body["metadata"]["name"])] = {**body, **decided}
        index.observe("ADDED", body)
    again = {b["metadata"]["name"]: "RATE_LIMITED" if index.verdict(b) else "EXECUTED" for b in bodies[::2]}
    assert again == {name: code for name, code in first.items() if name in again}


def test_a_slot_frees_at_the_refill_rate_and_the_message_says_when() -> None:
    taken = [Request(("home", f"r{i}"), NOW, "counted") for i in range(30)]
    limited = judge(taken, Request(("home", "next"), NOW, "open"), LIMIT)
    assert limited is not None and limited.taken == 30 and limited.frees_at == NOW + timedelta(seconds=2)
    assert judge(taken, Request(("home", "later"), NOW + timedelta(seconds=2), "open"), LIMIT) is None
    # Refusals take no slot; a minute later the bucket is full again.
    refused = [Request(("home", f"x{i}"), NOW, "limited") for i in range(100)]
    assert judge(refused, Request(("home", "next"), NOW, "open"), LIMIT) is None
    assert judge(taken, Request(("home", "much-later"), NOW + timedelta(seconds=60), "open"), LIMIT) is None

    decision = decide(intent(), DEVICE, True, [], HASH, NOW, limited=limited)
    assert (decision.outcome, decision.code) == ("final", "RATE_LIMITED")
    assert decision.message == (
        f"{intent().requester} is over its rate limit: at most 30 requests to act on devices at once, refilled at "
        "30 per 60 s (corral run --rate-limit); 30 were made in the 60 s before this one. Nothing was sent. The "
        "next slot frees at 12:00:02 UTC (in 2 s); ask again then.")
    # It is the first thing judged after a withdrawal: not even a missing device is looked at.
    gone = decide(intent(), DEVICE.__class__(exists=False, device_id=None, contract=None, online=None), True, [],
                  HASH, NOW, limited=limited)
    assert gone.code == "RATE_LIMITED"


def test_one_decided_in_the_same_second_counts_even_if_its_name_sorts_after() -> None:
    """A late arrival of the same second must not squeeze in ahead of what was already let through."""
    taken = [Request(("home", f"z{i:02d}"), NOW, "counted") for i in range(30)]
    assert judge(taken, Request(("home", "a-late"), NOW, "open"), LIMIT) is not None


def test_other_requesters_reads_dry_runs_and_a_replayed_name_are_not_counted() -> None:
    cache: dict[tuple[str, str], dict[str, Any]] = {}
    index = RequestIndex(LIMIT, cache.get)

    def add(body: dict[str, Any], decided: bool = True) -> None:
        cache[("home", body["metadata"]["name"])] = {**body, "status": {"phase": "Succeeded", "code": "EXECUTED"}
                                                     if decided else {}}
        index.observe("ADDED", body)

    for i in range(30):
        add(intent_body(f"agent-{i}", 0))
    for i in range(5):  # the same name again (a replay the API server refused) is one Intent
        add(intent_body("agent-0", 0))
        add(intent_body(f"read-{i}", 0, action="read"))
        add(intent_body(f"dry-{i}", 0, dryRun=True))
    assert index.verdict(intent_body("agent-next", 0)) is not None
    assert index.verdict(intent_body("person-1", 0, requester="alice")) is None  # positive control
    assert index.verdict(intent_body("read-next", 0, action="read")) is None
    assert index.verdict(intent_body("alias", 0, action="set_alias")) is None
    # One already let through (it waits for a person) is not judged again when an approval arrives.
    waiting = {**intent_body("agent-waits", 0), "status": {"phase": "AwaitingApproval"}}
    assert index.verdict(waiting) is None
    index.observe("DELETED", intent_body("agent-0", 0))
    assert index.verdict(intent_body("agent-next", 0)) is None
    # A replay of a deleted Intent's name, answered from the audit log, is a new Intent that sent nothing: no slot.
    for i, code in enumerate(("DEDUP", "DENY_ID_CONFLICT") * 3):
        replay = intent_body(f"replay-{i}", 0)
        cache[("home", f"replay-{i}")] = {**replay, "status": {"phase": "Denied", "code": code}}
        index.observe("ADDED", replay)
    assert index.verdict(intent_body("agent-next", 0)) is None
    add(intent_body("agent-30", 0))  # the positive control: one more that ran takes the slot
    assert index.verdict(intent_body("agent-next", 0)) is not None
    assert RequestIndex(RateLimit(0), cache.get).verdict(intent_body("agent-next", 0)) is None  # 0: no limit


@pytest.mark.parametrize("text,expected", [("30/60", RateLimit(30, timedelta(seconds=60))),
                                           ("10/min", RateLimit(10, timedelta(seconds=60))),
                                           ("0/60", RateLimit(0, timedelta(seconds=60)))])
def test_the_limit_is_written_calls_per_seconds(text: str, expected: RateLimit) -> None:
    assert RateLimit.parse(text) == expected


@pytest.mark.parametrize("text", ["30", "x/60", "30/0", "-1/60", "30/abc"])
def test_a_bad_limit_says_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match=r"use CALLS/SECONDS \(e\.g\. 30/60\) or CALLS/min"):
        RateLimit.parse(text)


def test_corral_run_refuses_a_bad_limit_before_anything_runs() -> None:
    result = CliRunner().invoke(cli, ["run", "--rate-limit", "thirty"])
    assert result.exit_code == 2
    assert "Invalid value for --rate-limit: 'thirty': use CALLS/SECONDS (e.g. 30/60)" in result.output
