"""A timed hold is one request about two values (issue 41, finding 2), pure: `then` and `holdFor` are hashed into
the request's identity and into what an approval binds to, a grant must cover `then` too, the revert skips the
pause and leases only for a value the decision covered, and every place a person or an agent reads the request
names what the hold puts back."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.cli.intents import change_text
from corral.console.waiting import hold_of, intent_view
from corral.console.words import Hold, confirmation, hold_duration, hold_text
from corral.contract.model import Contract
from corral.decide.approvals import People
from corral.decide.decision import Decision, DeviceFacts, IntentFacts, Policy, decide
from corral.decide.grants import GrantView, covering, why_not_covered
from corral.decide.holds import HoldFacts, TargetNow, judge_revert, revert_covered
from corral.decide.idempotency import compare, identity_hash, params_hash
from corral.gateway.tools.intents import hold_answer, outcome
from corral.notify.payloads import approval_request, render
from corral_sim.catalog import contract_for

NOW = datetime(2026, 12, 4, 9, 0, 0, tzinfo=UTC)
AGENT = "system:serviceaccount:home:agent"
SPEC: dict[str, Any] = {"device": "front-door", "actuator": "locked", "action": "set_state",
                        "params": {"value": True}, "reason": "leaving", "requester": AGENT}
HELD = {**SPEC, "holdFor": "8s", "then": {"value": False}}
CONTRACT = Contract.model_validate({**contract_for("lock"), "device_id": "front-door"})
DEVICE = DeviceFacts(exists=True, device_id="front-door", contract=CONTRACT, online=True)
LOCK_GRANT = GrantView(name="lock-up", grantor="alice", grantor_may_approve=True, requester=AGENT,
                       actuators=frozenset({"locked"}), uses=5, used=0, expires_at=NOW + timedelta(hours=1),
                       devices=frozenset({"front-door"}), values=(True,))


# ---- the request's identity and what an approval binds to ----------------------------------------------------


def test_hashes_of_requests_without_a_hold_are_the_ones_made_before() -> None:
    """Pinned: audit records and approvals made before `then` was hashed still match their Intents."""
    assert params_hash("home", SPEC) == "bb53bc59af6e79a1b1c3a9bc88cc96b09f519376d8f1799104111cc05f92d660"
    assert identity_hash(SPEC) == "0eee46268ffef08a899252c981a9c4e8911f986bf53b5ba329fc13f3c95b347b"


def test_then_and_hold_for_are_part_of_what_an_approval_binds_to() -> None:
    assert params_hash("home", HELD) != params_hash("home", SPEC)  # an approval of "locked = true" alone
    assert params_hash("home", HELD) != params_hash("home", {**HELD, "then": {"value": True}})
    assert params_hash("home", HELD) != params_hash("home", {**HELD, "holdFor": "9s"})
    assert params_hash("home", HELD) != params_hash("home", {k: v for k, v in HELD.items() if k != "then"})
    # Positive controls: who asks and why stay out; the same hold written otherwise is the same hold.
    assert params_hash("home", HELD) == params_hash("home", {**HELD, "reason": "other", "requester": "x"})
    assert params_hash("home", HELD) == params_hash("home", {**HELD, "holdFor": "8000ms"})
    assert params_hash("home", HELD) == params_hash("home", {**HELD, "then": {"value": False}})


def test_a_replay_with_another_then_is_a_conflict_and_the_same_then_a_dedup() -> None:
    assert compare(HELD, {**HELD, "then": {"value": True}}) == "DENY_ID_CONFLICT"
    assert compare(HELD, {k: v for k, v in HELD.items() if k != "then"}) == "DENY_ID_CONFLICT"
    assert compare(HELD, {**HELD, "holdFor": "1h"}) == "DENY_ID_CONFLICT"
    assert compare(HELD, {**HELD, "reason": "rephrased"}) == "DEDUP"
    assert compare(HELD, {**HELD, "holdFor": "8000ms"}) == "DEDUP"


# ---- grants cover both values or neither -----------------------------------------------------------------------


def test_a_grant_covers_a_hold_only_if_it_covers_then_too() -> None:
    missing = why_not_covered(LOCK_GRANT, AGENT, "front-door", {}, "locked", True, "high", NOW, then=False)
    assert missing == "it does not cover the value after the hold (then false)"
    assert why_not_covered(LOCK_GRANT, AGENT, "front-door", {}, "locked", True, "high", NOW) is None
    assert why_not_covered(LOCK_GRANT, AGENT, "front-door", {}, "locked", True, "high", NOW, then=True) is None
    both = replace(LOCK_GRANT, values=(True, False))
    assert covering([both], AGENT, "front-door", {}, "locked", True, "high", NOW, People(), then=False) == [both]


def intent(**changes: Any) -> IntentFacts:
    base = IntentFacts(uid="u-1", name="lock-1", device="front-door", actuator="locked", action="set_state",
                       value=True, requester=AGENT, created_at=NOW - timedelta(seconds=1), hold_for_s=8, then=False)
    return replace(base, **changes)


def test_a_hold_whose_then_is_not_granted_waits_for_a_person_and_says_why() -> None:
    waiting = decide(intent(), DEVICE, True, [], "a" * 64, NOW, Policy(), grants=[LOCK_GRANT])
    assert (waiting.outcome, waiting.grant) == ("await_approval", None), waiting
    assert "ApprovalGrant lock-up covers locked=true but not the value after the hold (then false)" in waiting.message
    # Positive controls: the same hold without then, or with a then the grant lists, runs on the grant.
    for asked in (intent(then=None), intent(then=True)):
        ran = decide(asked, DEVICE, True, [], "a" * 64, NOW, Policy(), grants=[LOCK_GRANT])
        assert (ran.outcome, ran.grant) == ("execute", "lock-up"), ran
    both = replace(LOCK_GRANT, values=(True, False))
    assert decide(intent(), DEVICE, True, [], "a" * 64, NOW, Policy(), grants=[both]).grant == "lock-up"


# ---- the revert skips the pause and leases only for what was covered -------------------------------------------


def test_only_a_then_decided_before_it_was_hashed_is_uncovered() -> None:
    now_hash = params_hash("home", HELD)
    assert revert_covered(True, now_hash, now_hash) is None
    assert revert_covered(False, params_hash("home", SPEC), now_hash) is None  # the value from before: by design
    assert "status.paramsHash leaves then out" in (revert_covered(True, params_hash("home", SPEC), now_hash) or "")


def facts(**changes: Any) -> HoldFacts:
    base = HoldFacts(intent="lock-1", device="front-door", actuator_id="locked", held=True, revert_to=False,
                     target=TargetNow(True, True, "corral-intents", "lock-1"), later=None,
                     actuator=CONTRACT.actuator("locked"))
    return replace(base, **changes)


def test_an_uncovered_then_is_put_back_only_if_it_passes_the_checks_of_a_new_request() -> None:
    covered = judge_revert(facts())
    assert (covered.kind, covered.value) == ("revert", False)  # positive control: nothing else asked
    paused = Decision("final", "DENY_PAUSED", "Agents are paused by alice.", "high", "write")
    stays = judge_revert(facts(uncovered="decided before", checks=paused))
    assert stays.kind == "Refused" and "DENY_PAUSED" in stays.message and "stays true" in stays.message, stays
    waits = Decision("await_approval", None, "Risk high: waiting", "high", "write")
    asks = judge_revert(facts(uncovered="decided before", checks=waits))
    assert asks.kind == "Refused" and "needs a person's approval, which a revert cannot wait for" in asks.message
    assert judge_revert(facts(uncovered="decided before")).kind == "Refused"
    passes = Decision("execute", None, "Checks passed.", "low", "write")
    ran = judge_revert(facts(uncovered="decided before", checks=passes))
    assert (ran.kind, ran.value) == ("revert", False) and "passed the checks of a new request" in ran.message


# ---- shown wherever a person or an agent reads the request ----------------------------------------------------


def test_the_card_shows_then_in_the_contracts_words_and_the_exact_form() -> None:
    body = {"metadata": {"name": "lock-1", "namespace": "home", "uid": "u-1"}, "spec": HELD,
            "status": {"phase": "AwaitingApproval", "risk": "high"}}
    view = intent_view(body, None, True, NOW, contract_for("lock"))
    assert (view.change, view.change_words) == ("locked = true", "Bolt → bolt thrown (locked)")
    assert (view.hold, view.then_words) == ("locked = false after 8 s", "Bolt → unlocked")
    assert view.confirm == ("Really set Bolt to “bolt thrown (locked)”, then to “unlocked” after 8 s, on "
                            "front-door? This is high risk.")
    plain = intent_view({**body, "spec": {**HELD, "then": None, "holdFor": "20m"}}, None, True, NOW, None)
    assert (plain.hold, plain.then_words) == ("the value from before after 20 min", "")
    none = intent_view({**body, "spec": SPEC}, None, True, NOW, contract_for("lock"))
    assert (none.hold, none.then_words) == ("", "")  # positive control: no hold, no row
    assert hold_of({"holdFor": "not a duration"}) is None


@pytest.mark.parametrize(("seconds", "words"), [(8, "8 s"), (90, "90 s"), (1200, "20 min"), (5400, "1 h 30 min"),
                                                (7200, "2 h"), (None, "")])
def test_a_holds_length_is_said_as_a_person_reads_it(seconds: float | None, words: str) -> None:
    assert hold_duration(seconds) == words


def test_then_text_is_made_safe_and_the_question_names_it_without_a_contract() -> None:
    assert hold_text("mode", Hold(8, "au\u202eto", True)) == 'mode = "auto" after 8 s'
    assert confirmation("high", "x", None, "locked", True, Hold(8, False, True)) == (
        "Really set locked to true, then to false after 8 s, on x? This is high risk.")


def test_corral_intents_shows_the_hold_and_what_it_puts_back() -> None:
    assert change_text(HELD) == "locked=true for 8s, then locked=false"
    assert change_text({**HELD, "then": None}) == "locked=true for 8s, then the value from before"
    assert change_text(SPEC) == "locked=true"


def test_notifications_name_the_hold_and_then() -> None:
    body = {"metadata": {"name": "lock-1", "namespace": "home", "uid": "u-1"}, "spec": HELD,
            "status": {"phase": "AwaitingApproval", "risk": "high"}}
    request = approval_request(body, None)
    assert "asks to set_state locked = true for 8s, then locked = false on front-door" in render(
        "ntfy", request).body.decode()
    assert "`for 8s, then locked = false`" in render("slack", request).body.decode()
    document = render("json", request).body.decode()
    assert '"holdFor": "8s"' in document and '"then": false' in document
    plain = render("json", approval_request({**body, "spec": SPEC}, None)).body.decode()
    assert "holdFor" not in plain and '"then"' not in plain


def test_the_mcp_answer_says_what_the_hold_puts_back() -> None:
    status = {"phase": "Succeeded", "code": "EXECUTED",
              "hold": {"state": "Pending", "until": "2026-12-04T09:00:08Z", "revertTo": False}}
    body = {"metadata": {"name": "lock-1", "namespace": "home"}, "spec": HELD, "status": status}
    answer = outcome(body, "lock-1")
    assert (answer["hold_for_s"], answer["then"]) == (8.0, False)
    assert answer["hold"] == {"state": "Pending", "until": "2026-12-04T09:00:08Z", "revert_to": False}
    assert hold_answer(SPEC, {}) == {}
    assert "then" not in hold_answer({**HELD, "then": None}, {})
    assert hold_answer({**HELD, "then": {"value": "x\u202e" + "y" * 200}}, {})["then"].endswith("…")
