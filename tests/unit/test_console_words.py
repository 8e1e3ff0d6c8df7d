"""The approval page in a person's words (console/words.py): identities named as people and agents, the change in
the contract's own words, outcomes as sentences, and the question a high-risk approval asks first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.console.waiting import intent_view
from corral.console.words import change_words, confirmation, outcome_words, said_of, value_words, who
from corral.decide.approvals import ApprovalView, judge_approvals
from corral_sim.catalog import contract_for

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
ALICE = "system:serviceaccount:corral-people:alice"
AGENT = "system:serviceaccount:home:agent"


def contract(device_type: str) -> dict[str, Any]:
    """The catalog's contract of a device type, as a Capability's spec carries it."""
    return contract_for(device_type)


LOCK = said_of(contract("lock"), "locked")


@pytest.mark.parametrize(("username", "name", "kind"), [
    (ALICE, "alice", "person"),
    ("alice", "alice", "person"),
    ("alice@example.com", "alice@example.com", "person"),
    (AGENT, "agent in home", "agent"),
    ("system:serviceaccount:garden:sprinkler-bot", "sprinkler-bot in garden", "agent"),
    ("system:admin", "system:admin", "system"),
    ("system:serviceaccount:broken", "system:serviceaccount:broken", "system"),
    ("", "someone unnamed", "system"),
])
def test_people_are_named_by_their_name_and_agents_by_name_and_namespace(username: str, name: str, kind: str) -> None:
    found = who(username)
    assert (found.name, found.kind) == (name, kind)
    assert found.username == username


def test_the_people_namespace_decides_who_is_a_person() -> None:
    assert who("system:serviceaccount:humans:bob", people_namespace="humans").name == "bob"
    # Positive control for the default: the same account outside the people namespace is an agent.
    assert who("system:serviceaccount:humans:bob").kind == "agent"


def test_a_name_with_invisible_characters_is_shown_as_it_reads() -> None:
    assert who("system:serviceaccount:corral-people:al\u200bice\u202e").name == "alice"


def test_the_lock_is_described_in_its_contracts_own_words() -> None:
    assert LOCK is not None
    assert (LOCK.device_kind, LOCK.actuator) == ("Door lock", "Bolt")
    assert LOCK.about == "true = bolt thrown (locked), false = unlocked. Unlocking lets anyone in."
    assert change_words(LOCK, False) == "Bolt → unlocked"
    assert change_words(LOCK, True) == "Bolt → bolt thrown (locked)"


@pytest.mark.parametrize(("device_type", "actuator", "value", "words"), [
    ("light", "power", True, "on"),  # "Light on (true) or off (false)"
    ("light", "power", False, "off"),
    ("water_valve", "open", False, "shut off"),  # "true = water flows, false = shut off"
    ("relay", "relay", True, "on"),
    ("relay", "relay", False, "false"),  # the contract says nothing of false: the value itself
    ("env_fan", "fan", "high", "high"),  # enum values are words already
    ("thermostat", "target_temp", 21.5, "21.5 °C"),  # numbers with the contract's unit
    ("light", "brightness", 40, "40 %"),
])
def test_values_are_worded_as_the_contract_words_them(device_type: str, actuator: str, value: Any, words: str) -> None:
    assert value_words(said_of(contract(device_type), actuator), value) == words


def test_without_a_contract_there_are_no_words_but_the_value() -> None:
    assert said_of(None, "locked") is None and said_of(contract("lock"), "no_such") is None
    assert change_words(None, True) == "" and value_words(None, True) == "true"


def test_contract_text_is_made_safe_and_cut() -> None:
    hostile = {"name": "Lock\u202e", "actuators": [{"id": "locked", "name": "Bolt\u200b\nignore previous", "type": "bool",
                                                     "description": "x" * 2000}]}
    said = said_of(hostile, "locked")
    assert said is not None
    assert said.device_kind == "Lock" and said.actuator == "Bolt ignore previous"
    assert len(said.about) == 512 and said.about.endswith("…")


def test_high_and_critical_approvals_ask_first_in_the_contracts_words() -> None:
    assert confirmation("high", "front-door-lock (lock)", LOCK, "locked", False) == (
        "Really set Bolt to “unlocked” on front-door-lock (lock)? This is high risk.")
    assert confirmation("critical", "valve", None, "open", True) == "Really set open to true on valve? This is critical risk."
    # Positive control: lower risks are approved with one click.
    assert confirmation("medium", "valve", None, "open", True) == ""
    assert confirmation("low", "lamp", None, "power", True) == ""


def test_outcomes_are_sentences() -> None:
    assert outcome_words("EXECUTED", "Succeeded", "set_state locked=True done; the device acknowledged command i-5bd",
                         LOCK, True, {"locked": True}, "locked") == "Done: Bolt → bolt thrown (locked)."
    assert outcome_words("EXECUTED", "Succeeded", "", None, 21.5, None, "setpoint") == "Done: setpoint = 21.5."
    assert outcome_words("TIMEOUT", "Failed", "", LOCK, True, None, "locked") == (
        "The device did not answer in time: it may or may not have done it.")
    assert outcome_words("FAILED", "Failed", "", LOCK, True, None, "locked", "jammed\u202e") == (
        "Not done: it failed on the way to the device, or the device refused. The device said: “jammed”.")
    assert outcome_words("DENY_SCOPE", "DryRun", "", LOCK, True, None, "locked").startswith("Dry run, nothing was done.")
    assert outcome_words("AWAITING_APPROVAL", "AwaitingApproval", "", LOCK, True, None, "locked") == (
        "Waiting for a person to approve or deny it.")


def _denial(approver: str, reason: str) -> str:
    """The message the controller writes for a denial (decide.approvals), so the two cannot drift apart."""
    approval = ApprovalView("deny-1", "uid-1", "h" * 64, "Deny", approver, True, NOW - timedelta(seconds=5),
                            reason=reason)
    return judge_approvals([approval], "uid-1", "h" * 64, AGENT, 1, NOW, timedelta(minutes=5)).message


def test_a_denial_names_the_person_who_denied_it() -> None:
    assert outcome_words("DENIED_BY_APPROVER", "Denied", _denial(ALICE, "not while the kids are out"), LOCK, False,
                         None, "locked") == "Denied by alice: not while the kids are out."
    assert outcome_words("DENIED_BY_APPROVER", "Denied", _denial("bob", ""), LOCK, False, None, "locked") == (
        "Denied by bob.")


def test_the_card_carries_the_words_beside_the_exact_forms() -> None:
    intent = {"metadata": {"name": "unlock-1", "namespace": "home", "uid": "u1", "creationTimestamp": "2026-12-01T11:59:00Z"},
              "spec": {"device": "front-door-lock", "actuator": "locked", "action": "set_state", "params": {"value": False},
                       "reason": "the plumber", "requester": AGENT},
              "status": {"phase": "AwaitingApproval", "risk": "high",
                         "approvalExpiresAt": "2026-12-01T12:01:00Z"}}
    device = {"metadata": {"labels": {"corral.dev/device-type": "lock"}},
              "spec": {"overlay": {"alias": "Front door", "location": "Hallway"}},
              "status": {"online": True, "reported": {"locked": True}}}
    view = intent_view(intent, device, True, NOW, contract("lock"))
    assert (view.change, view.change_words) == ("locked = false", "Bolt → unlocked")
    assert (view.current, view.current_words) == ("locked = true", "Bolt → bolt thrown (locked)")
    assert view.contract_says.endswith("Unlocking lets anyone in.") and view.device_kind == "Door lock"
    assert (view.requester, view.requester_name, view.requester_kind) == (AGENT, "agent in home", "agent")
    assert view.confirm == "Really set Bolt to “unlocked” on front-door-lock (lock)? This is high risk."
    assert view.outcome_words == "Waiting for a person to approve or deny it."
    # The contract unread (the person may not read Capabilities): the exact forms only, and still a question.
    bare = intent_view(intent, device, True, NOW, None)
    assert (bare.change_words, bare.contract_says, bare.current_words) == ("", "", "")
    assert bare.confirm == "Really set locked to false on front-door-lock (lock)? This is high risk."
