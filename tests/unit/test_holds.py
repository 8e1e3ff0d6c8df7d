"""Timed holds and on-time limits, pure: the pipeline's hold check, the hold an execution leaves, and the revert."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.contract.model import Actuator, Contract
from corral.decide.decision import PIPELINE, RESOLVING, DeviceFacts, Guards, IntentFacts, InterlockVerdict, decide
from corral.decide.holds import (
    HoldFacts,
    LaterIntent,
    TargetNow,
    judge_revert,
    pending_hold,
    revert_command_id,
)
from corral.reconcile.intents.facts import StoredIntent
from corral.reconcile.intents.holds import target_now

NOW = datetime(2026, 12, 3, 7, 0, 0, tzinfo=UTC)
CONTRACT = Contract.model_validate({
    "device_id": "heater", "name": "Heater", "model": "corral-heater", "fw": "1.0.0", "sensors": [],
    "actuators": [
        {"id": "power", "name": "Power", "type": "enum", "values": ["off", "low", "high"], "action": "set_level",
         "risk": "low", "level": "write", "max_on_seconds": 600, "hold_required": True},
        {"id": "fan", "name": "Fan", "type": "bool", "action": "set_state", "risk": "low", "level": "write",
         "max_on_seconds": 60},
        {"id": "light", "name": "Light", "type": "bool", "action": "set_state", "risk": "low", "level": "write",
         "failsafe": {"value": False, "delay_s": 10}},
        {"id": "feeder", "name": "Feeder", "type": "counter", "action": "feed", "range": {"min": 0, "max": 5},
         "risk": "low", "level": "write"},
    ],
})
DEVICE = DeviceFacts(exists=True, device_id="heater", contract=CONTRACT, online=True)


def actuator(name: str) -> Actuator:
    found = CONTRACT.actuator(name)
    assert found is not None
    return found


def ask(actuator_id: str = "power", value: object = "high", action: str = "set_level", **changes: Any) -> IntentFacts:
    base = IntentFacts(uid="u-1", name="warm-1", device="heater", actuator=actuator_id, action=action, value=value,
                       requester="system:serviceaccount:home:agent", created_at=NOW - timedelta(seconds=1))
    return replace(base, **changes)


def decided(i: IntentFacts) -> tuple[str | None, str]:
    decision = decide(i, DEVICE, True, [], "a" * 64, NOW, guards=Guards())
    return decision.code, decision.message


def test_the_hold_check_comes_right_after_the_arguments_and_is_rechecked_as_one() -> None:
    names = [c.name for c in PIPELINE]
    assert names[names.index("arguments") + 1] == "hold"
    assert "hold" in RESOLVING


def test_switching_on_an_actuator_that_requires_a_hold_without_one_is_refused_naming_the_limit() -> None:
    code, message = decided(ask())
    assert code == "DENY_ARGUMENTS"
    assert "requires a hold (holdFor) of at most 600 s" in message
    assert "its hardware may stay on at most 600 s" in message
    assert decided(ask(hold_for_s=600))[0] is None  # within the limit: it runs
    assert decided(ask(value="off"))[0] is None  # switching it off needs no hold


def test_a_hold_longer_than_the_maximum_is_refused_naming_the_maximum_only_when_switching_on() -> None:
    code, message = decided(ask(hold_for_s=601))
    assert code == "DENY_ARGUMENTS" and "at most 600 s" in message and "601 s" in message
    code, message = decided(ask("fan", True, "set_state", hold_for_s=61))
    assert code == "DENY_ARGUMENTS" and "at most 60 s" in message
    assert decided(ask("fan", True, "set_state"))[0] is None  # a limit without holdRequired needs no hold
    assert decided(ask("fan", False, "set_state", hold_for_s=3600))[0] is None  # off: the limit does not apply


def test_then_must_be_valid_and_must_not_leave_a_hold_required_actuator_on() -> None:
    code, message = decided(ask(hold_for_s=30, then="medium"))
    assert code == "DENY_ARGUMENTS" and "Invalid then" in message
    code, message = decided(ask(hold_for_s=30, then="low"))
    assert code == "DENY_ARGUMENTS" and 'set it to "off"' in message
    assert decided(ask(hold_for_s=30, then="off"))[0] is None


@pytest.mark.parametrize(("action", "actuator_id", "value"), [
    ("read", "power", None), ("acquire", "lease", None), ("set_alias", "alias", "Heater")])
def test_a_hold_on_what_sets_no_actuator_is_refused(action: str, actuator_id: str, value: object) -> None:
    code, message = decided(ask(actuator_id, value, action, hold_for_s=3))
    assert code == "DENY_ARGUMENTS" and "holdFor and then are for actions that set an actuator" in message


def test_a_hold_on_a_momentary_action_is_refused() -> None:
    code, message = decided(ask("feeder", 1, "feed", hold_for_s=3))
    assert code == "DENY_ARGUMENTS" and "not a state that can be put back" in message


def test_the_pending_hold_puts_back_then_or_the_value_from_before_and_never_on_for_a_hold_required_one() -> None:
    assert pending_hold(actuator("light"), True, None, {"light": False}, 3).revert_to is False
    assert pending_hold(actuator("light"), True, False, {"light": True}, 3).revert_to is False
    assert pending_hold(actuator("light"), True, None, {}, 3).revert_to is None
    hold = pending_hold(actuator("power"), "high", None, {"power": "low"}, 3)
    assert hold.revert_to == "off" and "requires a hold every time" in hold.message


def facts(**changes: Any) -> HoldFacts:
    base = HoldFacts(intent="lamp-1", device="heater", actuator_id="light", held=True, revert_to=False,
                     target=TargetNow(True, True, "corral-intents", "lamp-1"), later=None, actuator=actuator("light"))
    return replace(base, **changes)


def test_the_revert_puts_the_value_back_when_nothing_changed() -> None:
    revert = judge_revert(facts())
    assert (revert.kind, revert.value) == ("revert", False)
    # Another Intent's apply on another actuator of the Device names itself: the held value still stands.
    assert judge_revert(facts(target=TargetNow(True, True, "corral-intents", "fan-2"))).kind == "revert"


def test_a_change_by_someone_else_cancels_the_revert_and_says_who() -> None:
    by_person = judge_revert(facts(target=TargetNow(True, False, "kubectl")))
    assert by_person.kind == "Cancelled"
    assert "spec.target.light changed to false (by field manager kubectl)" in by_person.message
    by_intent = judge_revert(facts(later=LaterIntent("lamp-2", "system:serviceaccount:home:other")))
    assert by_intent.kind == "Cancelled"
    assert "changed by Intent lamp-2 of system:serviceaccount:home:other" in by_intent.message
    taken = judge_revert(facts(target=TargetNow(True, True, "kubectl")))
    assert taken.kind == "Cancelled" and "taken over (by field manager kubectl)" in taken.message
    removed = judge_revert(facts(target=TargetNow(False)))
    assert removed.kind == "Cancelled" and "removed" in removed.message


def test_an_interlock_that_forbids_the_earlier_value_sends_the_actuator_to_its_failsafe_value_or_refuses() -> None:
    forbids = (InterlockVerdict("no-dark-stairs", False, "someone is on the stairs"),)
    failsafe = judge_revert(facts(interlocks=forbids))
    assert failsafe.kind == "failsafe" and failsafe.value is False
    assert "Interlock no-dark-stairs forbids" in failsafe.message
    power = facts(actuator_id="power", held="high", revert_to="off", actuator=actuator("power"), interlocks=forbids,
                  target=TargetNow(True, "high", "corral-intents", "lamp-1"))
    refused = judge_revert(power)
    assert refused.kind == "Refused" and 'stays "high"' in refused.message and "no-dark-stairs" in refused.message
    assert judge_revert(replace(power, interlocks=(InterlockVerdict("ok", True),))).kind == "revert"


def test_the_revert_checks_only_the_device_its_contract_and_the_value() -> None:
    assert judge_revert(facts(actuator=None)).kind == "Refused"
    assert judge_revert(facts(target=None)).kind == "Refused"
    assert judge_revert(facts(revert_to="dim")).kind == "Refused"
    assert judge_revert(facts(revert_to=None)).kind == "Refused"


def test_the_revert_command_id_is_stable_and_not_the_intents_own() -> None:
    assert revert_command_id("u-1") == revert_command_id("u-1")
    assert revert_command_id("u-1").startswith("r-") and len(revert_command_id("u-1")) == 26
    assert revert_command_id("u-1") != revert_command_id("u-2")


def test_a_hold_that_replaces_a_pending_one_puts_back_what_that_one_would_have() -> None:
    extended = pending_hold(actuator("light"), True, None, {"light": True}, 600, earlier=("lamp-1", False))
    assert extended.revert_to is False and "hold of Intent lamp-1" in extended.message
    assert pending_hold(actuator("light"), True, True, {"light": False}, 600, earlier=("lamp-1", False)).revert_to is True


def test_a_stored_intent_with_a_hold_the_model_would_refuse_is_decided_not_malformed() -> None:
    def stored(spec: dict[str, Any]) -> StoredIntent:
        return StoredIntent.model_validate({
            "apiVersion": "corral.dev/v1alpha1", "kind": "Intent",
            "metadata": {"name": "x", "namespace": "home", "uid": "u-1", "creationTimestamp": NOW.isoformat()},
            "spec": {"device": "heater", "reason": "test", "requester": "agent", **spec}})

    read = stored({"actuator": "power", "action": "read", "holdFor": "3s"})
    assert read.spec.hold_for == "3s"
    assert decided(ask("power", None, "read", hold_for_s=3))[0] == "DENY_ARGUMENTS"
    long = stored({"actuator": "power", "action": "set_level", "params": {"value": "off"}, "holdFor": "48h",
                   "then": {"value": ["off"]}})
    assert long.spec.then is not None and long.spec.then.value == ["off"]
    code, message = decided(ask(value="off", hold_for_s=48 * 3600))
    assert code == "DENY_ARGUMENTS" and "at most 24h" in message
    assert decided(ask(value="off", hold_for_s=0))[0] == "DENY_ARGUMENTS"
    assert decided(ask(value="off", hold_for_s=30, then=["off"]))[0] == "DENY_ARGUMENTS"


def test_the_target_now_names_the_field_manager_that_owns_it_and_the_intent_that_applied_last() -> None:
    def entry(manager: str, *actuators: str) -> dict[str, Any]:
        return {"manager": manager, "operation": "Apply", "fieldsV1": {
            "f:spec": {"f:target": {f"f:{a}": {} for a in actuators}}}}

    body = {"metadata": {"annotations": {"corral.dev/intent": "lamp-1"},
                         "managedFields": [entry("corral-intents", "power", "brightness"), entry("kubectl", "brightness")]},
            "spec": {"target": {"power": True, "brightness": 30}}}
    assert target_now(body, "power") == TargetNow(True, True, "corral-intents", "lamp-1")
    assert target_now(body, "brightness") == TargetNow(True, 30, "kubectl", "lamp-1")  # shared: theirs
    assert target_now(body, "color_temp") == TargetNow(False, None, None, "lamp-1")
