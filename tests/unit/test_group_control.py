"""One call for a group (issue 32): the location label's normalization, the selector and its members' request ids, the
group's answer, `hold_for_s`, a group's share of the rate limit, and the Device wiring that keeps the label in step.
Pure: no cluster, no broker."""

from __future__ import annotations

import re
from typing import Any, cast

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.api.intent import IntentSpec
from corral.api.locations import LOCATION_LABEL, is_label_value, location_label, location_out_of_step
from corral.gateway.selectors import (
    MIXED,
    Selector,
    group_answer,
    member_request_id,
    nothing_matched,
    parse_selector,
    resolve,
    too_many,
)
from corral.gateway.tools.arguments import REQUEST_ID, ArgumentError, hold_for
from corral.gateway.tools.base import RateLimit
from corral.gateway.tools.control import intent_spec
from corral.gateway.toolset import Grants, device_tools, fixed_tools
from corral.gateway.visible import VisibleDevice, action_of
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.wiring import DeviceEvents
from tests.unit.test_gateway_exposure import CONTRACT

# ---- the location label ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("location", "label"), [
    ("Utility room", "utility-room"),
    ("kitchen", "kitchen"),
    ("Kitchen, above the sink", "kitchen-above-the-sink"),
    ("  Küche  ", "kuche"),
    ("Straße 5", "strasse-5"),
    ("ＫＩＴＣＨＥＮ", "kitchen"),
    ("Floor 1.5 -- east wing!", "floor-1.5-east-wing"),
    ("_attic_", "attic"),
    ("", None),
    ("   ", None),
    ("!!! ???", None),
    (None, None),
])
def test_a_location_becomes_a_label_value(location: str | None, label: str | None) -> None:
    assert location_label(location) == label


def test_another_script_gets_a_stable_label_and_a_long_location_is_cut_to_63() -> None:
    kitchen = location_label("厨房")
    assert kitchen is not None and re.fullmatch(r"loc-[0-9a-f]{10}", kitchen)
    assert location_label("厨房") == kitchen != location_label("浴室")
    long = location_label("a" * 40 + " " + "b" * 23)
    assert long is not None and len(long) == 63 and long.endswith("b") and is_label_value(long)
    assert location_label("a" * 62 + " b") == "a" * 62, "no dangling '-' after the cut"


@given(st.text(max_size=64))
def test_every_location_gives_a_legal_label_value_or_none_and_normalizing_it_again_keeps_it(text: str) -> None:
    label = location_label(text)
    if label is not None:
        assert is_label_value(label) and label, label
        assert location_label(label) == label


def test_a_label_is_out_of_step_when_it_differs_from_the_overlay() -> None:
    assert not location_out_of_step({LOCATION_LABEL: "utility-room"}, "Utility room")
    assert location_out_of_step({}, "Utility room")
    assert location_out_of_step({LOCATION_LABEL: "kitchen"}, "Utility room")
    assert location_out_of_step({LOCATION_LABEL: "kitchen"}, "")
    assert not location_out_of_step(None, None) and not location_out_of_step({"other": "x"}, "")


# ---- the selector ----------------------------------------------------------------------------------------------

def lamp(name: str, location: str | None = None, namespace: str = "home", **labels: str) -> VisibleDevice:
    all_labels = {**labels, **({LOCATION_LABEL: location} if location else {})}
    body = {"metadata": {"namespace": namespace, "name": name, "labels": all_labels},
            "spec": {"deviceId": name, "target": {}}, "status": {"online": True}}
    return VisibleDevice(namespace, name, body, CONTRACT, frozenset({"read", "write"}))


LAMPS = [lamp("lamp-1", "utility-room", kind="light"), lamp("lamp-2", "utility-room", kind="light"),
         lamp("lamp-3", "utility-room", kind="heater"), lamp("lamp-4", "kitchen", kind="light"), lamp("lamp-5")]


def test_a_location_selector_is_normalized_like_the_label_and_labels_must_all_match() -> None:
    by_location = parse_selector({"location": "Utility Room"})
    assert by_location == Selector({}, "utility-room", "Utility Room")
    assert [d.name for d in resolve(LAMPS, by_location)] == ["lamp-1", "lamp-2", "lamp-3"]
    assert [d.name for d in resolve(LAMPS, parse_selector({"location": "utility-room"}))] == [
        "lamp-1", "lamp-2", "lamp-3"], "the label value itself selects the same devices"
    assert [d.name for d in resolve(LAMPS, parse_selector({"labels": {"kind": "light"}}))] == [
        "lamp-1", "lamp-2", "lamp-4"]
    both = parse_selector({"location": "utility room", "labels": {"kind": "light"}})
    assert [d.name for d in resolve(LAMPS, both)] == ["lamp-1", "lamp-2"]
    assert both.as_dict() == {"labels": {"kind": "light"}, "location": "utility-room"}


@pytest.mark.parametrize(("selector", "says"), [
    ({}, "selector must be"),
    ({"room": "kitchen"}, "selector must be"),
    ("kitchen", "selector must be"),
    ({"labels": {}}, "needs labels or a location"),
    ({"labels": {"kind": 3}}, "label value"),
    ({"labels": {"bad key!": "x"}}, "not a Kubernetes label key"),
    ({"labels": {"kind": "no spaces"}}, "label value"),
    ({"location": ""}, "1-64 characters"),
    ({"location": "x" * 65}, "1-64 characters"),
    ({"location": "kitchen\n"}, "1-64 characters"),
    ({"location": "!!!"}, "no letters or digits"),
])
def test_a_malformed_selector_is_refused_with_what_is_allowed(selector: Any, says: str) -> None:
    with pytest.raises(ArgumentError, match=says) as refused:
        parse_selector(selector)
    assert refused.value.code == "DENY_ARGUMENTS"


def test_nothing_matched_says_which_locations_and_labels_the_caller_can_see() -> None:
    text = nothing_matched(LAMPS, parse_selector({"location": "Attic"}))
    assert "location 'attic'" in text and "nothing was requested" in text
    assert "kitchen (1), utility-room (3)" in text and "kind=heater (1), kind=light (3)" in text


def test_a_group_over_the_cap_is_refused_saying_how_to_narrow_it() -> None:
    text = too_many(51, parse_selector({"labels": {"kind": "Light"}}))
    assert text.startswith("The selector (labels kind=Light) matches 51 devices") and "at most 50" in text
    assert "Nothing was requested" in text


def test_member_request_ids_are_stable_distinct_and_valid_intent_names() -> None:
    a, b = lamp("lamp-1"), lamp("lamp-1", namespace="garage")
    first = member_request_id("lights-off", a)
    assert first == member_request_id("lights-off", a), "a retried call names the same Intent"
    assert first.startswith("lights-off-lamp-1-") and REQUEST_ID.fullmatch(first)
    assert first != member_request_id("lights-off", b), "same name in two namespaces"
    assert first != member_request_id("lights-of", a)
    long = member_request_id("r" * 63, lamp("x" * 63))
    assert len(long) <= 63 and REQUEST_ID.fullmatch(long)
    dotted = member_request_id("req", lamp("porch.light"))
    assert REQUEST_ID.fullmatch(dotted) and "porch-light" in dotted


# ---- the group's answer ----------------------------------------------------------------------------------------

def result(device: str, code: str, phase: str | None) -> dict[str, Any]:
    return {"device_id": f"home/{device}", "request_id": f"r-{device}", "code": code, "message": "m", "phase": phase}


def test_one_failed_member_makes_the_group_an_error_with_no_success_code() -> None:
    results = [result(f"lamp-{i}", "EXECUTED", "Succeeded") for i in range(1, 5)]
    results.append(result("lamp-5", "DEVICE_GONE", "Failed"))
    answer, failed = group_answer("r", parse_selector({"location": "kitchen"}), results, False)
    assert failed and answer["code"] == MIXED
    assert answer["message"].startswith("4 of 5 EXECUTED; 1 DEVICE_GONE (home/lamp-5).")
    assert "Not every device succeeded" in answer["message"]
    assert answer["summary"] == {"devices": 5, "succeeded": 4, "waiting": 0, "failed": 1,
                                 "codes": {"EXECUTED": 4, "DEVICE_GONE": 1}}


def test_all_executed_is_executed_and_waiting_is_no_failure() -> None:
    done = [result("a", "EXECUTED", "Succeeded"), result("b", "EXECUTED", "Succeeded")]
    answer, failed = group_answer("r", parse_selector({"location": "kitchen"}), done, False)
    assert (answer["code"], failed, answer["message"]) == ("EXECUTED", False, "2 of 2 EXECUTED.")
    waiting = [done[0], result("b", "AWAITING_APPROVAL", "AwaitingApproval")]
    answer, failed = group_answer("r", parse_selector({"location": "kitchen"}), waiting, False)
    assert answer["code"] == MIXED and not failed and "iot.intent_status" in answer["message"]
    retried = [result("a", "DEDUP", "Succeeded"), result("b", "DEDUP", "Failed")]
    answer, failed = group_answer("r", parse_selector({"location": "kitchen"}), retried, False)
    assert answer["code"] == "DEDUP" and failed, "a retry of a group in which one failed still failed"
    answer, failed = group_answer("r", parse_selector({"location": "kitchen"}), done, True)
    assert answer["message"].startswith("Dry run, nothing was executed: ") and answer["dry_run"] is True


def test_the_summary_names_at_most_five_devices_per_code() -> None:
    results = [result(f"d{i}", "DENY_SCOPE", None) for i in range(8)]
    answer, _ = group_answer("r", parse_selector({"labels": {"a": "b"}}), results, False)
    assert "8 DENY_SCOPE (home/d0, home/d1, home/d2, home/d3, home/d4 and 3 more)" in answer["message"]


def test_the_group_answer_fits_the_tools_output_schema() -> None:
    tools = {t["name"]: t for t in fixed_tools(LAMPS, Grants(frozenset({"home"})), [])}
    control = tools["iot.control"]
    results = [{**result("lamp-1", "EXECUTED", "Succeeded"), "intent": "home/r-lamp-1", "before": {"light": False},
                "after": {"light": True}, "dry_run": False},
               {**result("lamp-5", "DEVICE_GONE", None), "intent": None, "before": None, "after": None}]
    answer, _ = group_answer("r", parse_selector({"location": "kitchen"}), results, False)
    jsonschema.validate(answer, control["outputSchema"])
    schema = control["inputSchema"]
    assert "device_id" not in schema["required"] and {"selector", "hold_for_s"} <= set(schema["properties"])
    assert "MIXED" in control["description"] and "hold_for_s" in control["description"]
    jsonschema.validate({"selector": {"location": "Utility room", "labels": {"kind": "light"}}, "actuator": "light",
                         "action": "set_state", "params": {"value": True}, "reason": "r", "hold_for_s": 20}, schema)


# ---- hold_for_s ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("seconds", "written"), [(20, "20s"), (1.5, "1500ms"), (0.001, "1ms"), (86400, "86400s"),
                                                   (None, None)])
def test_hold_for_s_becomes_the_intents_hold_for(seconds: float | None, written: str | None) -> None:
    assert hold_for(seconds) == written


@pytest.mark.parametrize("seconds", [0, -1, 86400.5, True, "20", 0.0001])
def test_a_hold_outside_0_to_a_day_is_refused(seconds: Any) -> None:
    with pytest.raises(ArgumentError, match="hold_for_s must be"):
        hold_for(seconds)


def test_a_hold_goes_into_the_intent_and_fits_it() -> None:
    _, spec = intent_spec(LAMPS[0], {"actuator": "light", "action": "set_state", "params": {"value": True},
                                     "reason": "for a while", "hold_for_s": 20}, "agent", lambda _: None)
    assert spec["holdFor"] == "20s"
    assert IntentSpec.model_validate(spec).hold_for == "20s"


# ---- the rate limit: one call per member -----------------------------------------------------------------------

def test_a_group_takes_one_call_per_device_all_or_nothing() -> None:
    limit = RateLimit(10, 10.0)
    assert limit.take("agent", 0.0, 6) == 0.0
    wait = limit.take("agent", 0.0, 5)
    assert wait == pytest.approx(1.0), "4 left, 5 needed, one more a second"
    assert limit.take("agent", 0.0, 4) == 0.0, "the refused group took nothing"
    assert limit.take("agent", 0.0, 11) == float("inf"), "more than the limit ever allows"
    assert limit.take("other", 0.0, 10) == 0.0


# ---- the Device wiring: a label someone changed by hand is put back --------------------------------------------

def body(version: str, generation: int, labels: dict[str, str], location: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "home", "name": "lamp", "uid": "u1", "resourceVersion": version,
                         "generation": generation, "labels": labels},
            "spec": {"deviceId": "lamp-1", "overlay": {"location": location}}}


def test_a_label_only_change_queues_the_device_only_when_the_label_left_the_overlay() -> None:
    queued: list[str] = []
    queue: Any = type("Queue", (), {"add": lambda self, key: queued.append(key)})()
    events = DeviceEvents(DeviceCache(), queue, adopt=cast(Any, lambda _: None))
    events.on_device_event("ADDED", body("1", 1, {}, "Kitchen"))
    events.on_device_event("MODIFIED", body("2", 1, {LOCATION_LABEL: "kitchen"}, "Kitchen"))
    assert queued == ["lamp-1"], "the controller's own label write is in step: nothing to do"
    events.on_device_event("MODIFIED", body("3", 1, {LOCATION_LABEL: "attic"}, "Kitchen"))
    events.on_device_event("MODIFIED", body("4", 1, {}, "Kitchen"))
    assert queued == ["lamp-1", "lamp-1", "lamp-1"]


def test_an_actuator_that_needs_a_hold_says_so_in_iot_query_and_in_its_own_tool() -> None:
    contract = CONTRACT.model_validate({
        "device_id": "x", "name": "Heater", "model": "corral-heater", "fw": "1.0.0", "sensors": [],
        "actuators": [{"id": "power", "name": "Power", "type": "bool", "action": "set_state", "risk": "high",
                       "level": "write", "max_on_seconds": 600, "hold_required": True},
                      {"id": "fan", "name": "Fan", "type": "bool", "action": "set_state", "risk": "low",
                       "level": "write"}]})
    heater = VisibleDevice("home", "heater", lamp("heater").body, contract, frozenset({"read", "write"}))
    power, fan = (action_of(a) for a in contract.actuators)
    assert (power["max_on_s"], power["hold_required"]) == (600, True)
    assert "max_on_s" not in fan and "hold_required" not in fan
    tools = device_tools([heater], Grants(frozenset({"home"})))
    assert "Needs hold_for_s (at most 600 s)." in tools["heater.power.set_state"][2]["description"]
    assert "hold_for_s" not in tools["heater.fan.set_state"][2]["description"]
    assert "hold_for_s" in tools["heater.fan.set_state"][2]["inputSchema"]["properties"]
