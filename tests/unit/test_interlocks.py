"""Interlocks without a cluster: compiling, which actions a rule guards, verdicts over the namespace's state with
the clock injected, the cost bounds, the denial code, and what the device reconciler does with a forbidden target."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.api.device import Device, GuardingInterlock, InterlockedTarget
from corral.api.interlock import Interlock
from corral.contract.model import Contract
from corral.decide.decision import DeviceFacts, Guards, IntentFacts, InterlockVerdict, decide, recheck
from corral.decide.evidence import Received
from corral.decide.interlocks import (
    Compiled,
    Rule,
    applies,
    compile_rule,
    evaluate,
    recent_readings,
)
from corral.decide.selectors import Requirement, Selector
from corral.devices.plan import Command, Plan
from corral.devices.telemetry import Reading
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.devices.reconciler import DeviceReconciler
from corral.reconcile.devices.runtime import DeviceRuntime
from corral.reconcile.devices.status import Observed, Verdict, device_status
from corral.reconcile.guards.interlocks import Interlocks, rule_of

NOW_MS = 1_796_000_000_000.0
MESSAGE = "The main water valve may not open while the leak probe reports wet."
MAIN_WATER = Rule(name="main-water", condition='!readings["leak-probe"]["wet"]', message=MESSAGE,
                  devices=("main-water-valve",), actuators=("open",), values=(True,), max_reading_age_s=5)
PROBE_ONLINE = {"leak-probe": {"reported": {}, "online": True}}


def verdict_for(samples: dict[str, dict[str, Received]], rule: Rule = MAIN_WATER, now_ms: float = NOW_MS,
                devices: dict[str, Any] | None = None) -> InterlockVerdict:
    readings, too_old = recent_readings(samples, rule.max_reading_age_s, now_ms)
    return evaluate(compile_rule(rule), PROBE_ONLINE if devices is None else devices, readings, too_old)


def probe(wet: object, received_ms: float = NOW_MS - 1000) -> dict[str, dict[str, Received]]:
    return {"leak-probe": {"wet": Received(ts=int(received_ms), received_ms=received_ms, value=wet)}}


# ---- compiling ------------------------------------------------------------------------------------------------

def test_a_boolean_condition_compiles() -> None:
    assert compile_rule(MAIN_WATER).ok
    assert compile_rule(replace(MAIN_WATER, condition='devices["leak-probe"].reported.wet == false')).ok


@pytest.mark.parametrize(("condition", "problem"), [
    ('!readings["leak-probe"]["wet"] &&', "line 1, column 34: Syntax error"),
    ("leak_probe.wet", "undeclared reference to 'leak_probe.wet'"),
    ('size(readings["leak-probe"])', "gives int, not a boolean"),
    ("1 + 'a' == 2", "no matching overload"),
    ("(" * 40 + "true" + ")" * 40, "recursion limit"),
])
def test_what_does_not_compile_says_why_in_one_line(condition: str, problem: str) -> None:
    compiled = compile_rule(replace(MAIN_WATER, condition=condition))
    assert not compiled.ok and compiled.error is not None
    assert problem in compiled.error and "\n" not in compiled.error


def test_a_rule_that_does_not_compile_forbids_what_it_guards() -> None:
    verdict = evaluate(compile_rule(replace(MAIN_WATER, condition="nonsense(")), PROBE_ONLINE, {"leak-probe": {"wet": False}})
    assert not verdict.holds and "does not compile" in verdict.message and verdict.message.startswith(MESSAGE)


# ---- what a rule guards ---------------------------------------------------------------------------------------

def test_a_rule_guards_its_devices_actuators_and_values_only() -> None:
    assert applies(MAIN_WATER, "main-water-valve", {}, "open", True)
    assert not applies(MAIN_WATER, "main-water-valve", {}, "open", False), "closing is always allowed"
    assert not applies(MAIN_WATER, "main-water-valve", {}, "open", 1), "1 is not true"
    assert not applies(MAIN_WATER, "main-water-valve", {}, "firmware", "1.3.0")
    assert not applies(MAIN_WATER, "kitchen-sink-valve", {}, "open", True)
    anything = replace(MAIN_WATER, actuators=(), values=())
    assert applies(anything, "main-water-valve", {}, "firmware", "1.3.0")
    numeric = replace(MAIN_WATER, actuators=("level",), values=(40,))
    assert applies(numeric, "main-water-valve", {}, "level", 40.0)


def test_selectors_match_as_kubernetes_label_selectors_do() -> None:
    valves = replace(MAIN_WATER, devices=(), selector=Selector({"plumbing": "water-valve"}))
    assert applies(valves, "kitchen-sink-valve", {"plumbing": "water-valve"}, "open", True)
    assert not applies(valves, "kitchen-sink-valve", {"plumbing": "relay"}, "open", True)
    rooms = Selector(requirements=(Requirement("room", "In", ("kitchen", "utility")), Requirement("test", "DoesNotExist"),
                                   Requirement("floor", "NotIn", ("attic",))))
    assert rooms.matches({"room": "kitchen"}) and rooms.matches({"room": "utility", "floor": "1"})
    assert not rooms.matches({"room": "kitchen", "test": "yes"}) and not rooms.matches({"room": "hall"})
    assert not rooms.matches({"room": "kitchen", "floor": "attic"})
    assert Selector(requirements=(Requirement("room", "Exists"),)).matches({"room": ""})
    assert Selector().matches({}), "an empty selector matches every Device"


def test_the_api_model_becomes_the_rule_and_needs_something_guarded() -> None:
    body = {"apiVersion": "corral.dev/v1alpha1", "kind": "Interlock", "metadata": {"name": "main-water"},
            "spec": {"guards": {"devices": ["main-water-valve"], "actuators": ["open"], "values": [True],
                                "selector": {"matchExpressions": [{"key": "room", "operator": "Exists"}]}},
                     "condition": MAIN_WATER.condition, "maxReadingAgeSeconds": 5, "message": MESSAGE}}
    rule = rule_of(body)
    assert (rule.devices, rule.actuators, rule.values, rule.max_reading_age_s) == (("main-water-valve",), ("open",),
                                                                                 (True,), 5.0)
    assert rule.selector == Selector({}, (Requirement("room", "Exists"),))
    with pytest.raises(ValueError, match="name the guarded Devices"):
        Interlock.model_validate({**body, "spec": {**body["spec"], "guards": {"actuators": ["open"]}}})
    with pytest.raises(ValueError, match="control characters"):
        Interlock.model_validate({**body, "spec": {**body["spec"], "condition": "true\x1b[2J"}})
    assert Interlock.model_validate({**body, "spec": {**body["spec"], "condition": "true &&\n\ttrue"}})


# ---- verdicts -------------------------------------------------------------------------------------------------

def test_it_forbids_while_wet_and_allows_when_dry() -> None:
    wet, dry = verdict_for(probe(True)), verdict_for(probe(False))
    assert (wet.name, wet.holds, wet.message) == ("main-water", False, MESSAGE)
    assert (dry.holds, dry.message) == (True, MESSAGE)


def test_a_missing_probe_forbids_and_says_so() -> None:
    verdict = verdict_for({}, devices={})
    assert not verdict.holds and verdict.message.startswith(MESSAGE)
    assert 'there is no Device or reading "leak-probe"' in verdict.message
    silent = verdict_for({})  # the Device is there, its readings are not
    assert not silent.holds and "Device leak-probe has sent no reading in the last 5 s" in silent.message


def test_a_reading_older_than_the_rule_allows_is_left_out_by_when_the_controller_received_it() -> None:
    # The device's own ts says "just now"; the controller received it 7 s ago: too old.
    samples = {"leak-probe": {"wet": Received(ts=int(NOW_MS), received_ms=NOW_MS - 7000, value=False)}}
    readings, too_old = recent_readings(samples, 5, NOW_MS)
    assert readings == {} and too_old == {"leak-probe": {"wet": 7.0}}
    verdict = verdict_for(samples)
    assert not verdict.holds and "the readings of leak-probe are too old (the newest is 7.0 s old; the rule allows " \
                                 "5 s)" in verdict.message
    assert verdict_for(samples, now_ms=NOW_MS - 3000).holds, "three seconds earlier it was fresh enough"


def test_one_too_old_metric_among_fresh_ones_is_named() -> None:
    samples = {"leak-probe": {"wet": Received(0, NOW_MS - 9000, False), "battery": Received(0, NOW_MS - 100, 90)}}
    verdict = verdict_for(samples)
    assert not verdict.holds and "the reading leak-probe/wet is too old (9.0 s; the rule allows 5 s)" in verdict.message


def test_reported_state_and_online_are_there_too() -> None:
    rule = replace(MAIN_WATER, condition='devices["leak-probe"].online && !devices["leak-probe"].reported.wet')
    online = {"leak-probe": {"reported": {"wet": False}, "online": True}}
    assert verdict_for({}, rule, devices=online).holds
    assert not verdict_for({}, rule, devices={"leak-probe": {"reported": {"wet": False}, "online": False}}).holds


def test_a_value_that_is_not_a_boolean_forbids() -> None:
    verdict = verdict_for(probe("soaked"))
    assert not verdict.holds and "not evaluable" in verdict.message
    dyn = replace(MAIN_WATER, condition='readings["leak-probe"]["wet"]')
    assert not verdict_for(probe(3), dyn).holds, "a number is not true"
    assert "gave int, not a boolean" in verdict_for(probe(3), dyn).message


def test_an_evaluation_beyond_the_iteration_budget_forbids() -> None:
    hundred = "[" + ",".join(str(i) for i in range(100)) + "]"
    rule = replace(MAIN_WATER, condition=f"{hundred}.all(a, {hundred}.all(b, {hundred}.all(c, a + b + c >= 0)))")
    compiled = compile_rule(rule)
    assert compiled.ok
    verdict = evaluate(compiled, PROBE_ONLINE, {})
    assert not verdict.holds and "exceeds the evaluation budget (10,000 comprehension iterations)" in verdict.message


def test_an_evaluation_over_the_time_limit_forbids() -> None:
    ticks = iter([0.0, 0.25])
    verdict = evaluate(compile_rule(MAIN_WATER), PROBE_ONLINE, {"leak-probe": {"wet": False}},
                       timer=lambda: next(ticks))
    assert not verdict.holds and "took 250 ms, more than the 100 ms allowed" in verdict.message


# ---- the decision ---------------------------------------------------------------------------------------------

VALVE = Contract.model_validate({
    "device_id": "main-water-valve", "name": "Valve", "model": "corral-valve", "fw": "1.2.0",
    "actuators": [{"id": "open", "name": "Valve", "type": "bool", "action": "set_state", "risk": "low",
                   "level": "write"}],
})
NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
OPEN = IntentFacts(uid="5f0c3a52-8e2b-4c1e-9a55-0d4c2f6b7e19", name="open-1", device="main-water-valve",
                   actuator="open", action="set_state", value=True, requester="agent",
                   created_at=NOW - timedelta(seconds=1))
DEVICE = DeviceFacts(exists=True, device_id="main-water-valve", contract=VALVE, online=True)


def test_a_rule_that_does_not_hold_denies_with_its_name_and_message_at_decision_and_before_execution() -> None:
    wet = Guards(interlocks=(verdict_for(probe(True)),))
    decided = decide(OPEN, DEVICE, True, [], "a" * 64, NOW, guards=wet)
    assert decided.code == "DENY_INTERLOCK"
    assert decided.message == f"Interlock main-water forbids this now: {MESSAGE}"
    assert decide(OPEN, DEVICE, True, [], "a" * 64, NOW, guards=Guards(interlocks=(verdict_for(probe(False)),))
                  ).outcome == "execute"
    again = recheck(OPEN, DEVICE, True, NOW, Guards(interlocks=(verdict_for({}, devices={}),)))
    assert again is not None and again.code == "DENY_INTERLOCK" and "leak-probe" in again.message


# ---- the controller's side: verdicts over the namespace, a forbidden target -------------------------------------

def device_body(name: str, labels: dict[str, str] | None = None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "home", "uid": f"uid-{name}", "resourceVersion": "1",
                         "generation": 2, "labels": labels or {}},
            "spec": {"deviceId": name, "target": {"open": True}}, "status": status or {}}


def device_model(name: str, status: dict[str, Any] | None = None) -> Device:
    """The Device as the device reconciler reads it: the model its cache holds."""
    return Device.model_validate(device_body(name, status=status))


def interlock_body(condition: str = MAIN_WATER.condition) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Interlock",
            "metadata": {"name": "main-water", "namespace": "home", "uid": "u-1", "resourceVersion": "5",
                         "generation": 1},
            "spec": {"guards": {"devices": ["main-water-valve"], "actuators": ["open"], "values": [True]},
                     "condition": condition, "maxReadingAgeSeconds": 5, "message": MESSAGE}}


class FakeKube:
    api = None


def interlocks(clock_s: float, wet: bool, received_ms: float) -> tuple[Interlocks, DeviceCache, Any]:
    cache = DeviceCache()
    for name in ("main-water-valve", "leak-probe"):
        cache.upsert(device_body(name))
    changed: list[str] = []
    component = Interlocks(FakeKube(), cache, ("home",), on_change=changed.append,
                           clock=lambda: clock_s)
    component.on_event("ADDED", interlock_body())
    assert changed == ["home"]

    def view_of(namespace: str, name: str) -> DeviceView | None:
        body = cache.get((namespace, name))
        if body is None:
            return None
        latest = {"wet": Reading("wet", wet, int(received_ms), received_ms)} if name == "leak-probe" else {}
        return DeviceView(body, name, True, True, online=True, latest=latest)

    return component, cache, view_of


def test_the_controller_judges_over_the_readings_it_received_by_its_own_clock() -> None:
    now_s = NOW_MS / 1000
    wet, cache, view_of = interlocks(now_s, True, NOW_MS - 1000)
    valve = cache.get(("home", "main-water-valve"))
    assert valve is not None
    (verdict,) = wet.verdicts("home", valve, "open", True, view_of)
    assert not verdict.holds and verdict.message == MESSAGE
    assert wet.verdicts("home", valve, "open", False, view_of) == (), "closing is not guarded"
    assert [c.rule.name for c in wet.guarding("home", valve)] == ["main-water"]
    dry, cache, view_of = interlocks(now_s, False, NOW_MS - 1000)
    assert dry.verdicts("home", valve, "open", True, view_of)[0].holds
    stale, cache, view_of = interlocks(now_s + 10, False, NOW_MS - 1000)
    (old,) = stale.verdicts("home", valve, "open", True, view_of)
    assert not old.holds and "too old" in old.message


def test_a_changed_interlock_is_compiled_again_and_a_deleted_one_guards_nothing() -> None:
    component, cache, view_of = interlocks(NOW_MS / 1000, False, NOW_MS)
    broken = interlock_body("!readings[")
    broken["metadata"] = {**broken["metadata"], "generation": 2, "resourceVersion": "6"}
    component.on_event("MODIFIED", broken)
    assert not component.rules["home"]["main-water"].ok
    valve = cache.get(("home", "main-water-valve"))
    assert valve is not None
    assert not component.verdicts("home", valve, "open", True, view_of)[0].holds
    component.on_event("DELETED", broken)
    assert component.verdicts("home", valve, "open", True, view_of) == ()


class FakeInterlocks:
    def __init__(self, holds: bool) -> None:
        self.holds = holds
        self.asked: list[tuple[str, Any]] = []

    def verdicts(self, namespace: str, device: dict[str, Any], actuator: str, value: Any, view_of: Any
                 ) -> tuple[InterlockVerdict, ...]:
        self.asked.append((actuator, value))
        return (InterlockVerdict("main-water", self.holds, MESSAGE),)


class FakeNotices:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []

    def once(self, rt: DeviceRuntime, body: dict[str, Any], key: str, reason: str, action: str, note: str,
             type_: str = "Normal", fact: Any = None) -> None:
        if key not in rt.announced:
            rt.announced.add(key)
            self.posted.append((reason, note))


def reconciler(holds: bool) -> tuple[DeviceReconciler, FakeInterlocks, FakeNotices]:
    rules, notices = FakeInterlocks(holds), FakeNotices()
    unused: Any = None
    made = DeviceReconciler(unused, unused, unused, DeviceCache(), unused, notices, unused, unused,
                            unused, rules, lambda namespace, name: None)
    return made, rules, notices


OPEN_CMD = Command("abc-g2-e0-open", "open", "set_state", True)
HELD = {"interlockedTargets": [{"actuator": "open", "value": True, "interlock": "main-water", "message": MESSAGE}]}


def test_a_forbidden_target_is_not_driven_and_is_held_on_record() -> None:
    made, _rules, notices = reconciler(holds=False)
    rt = DeviceRuntime("main-water-valve")
    result, held = made._interlocked(rt, device_model("main-water-valve"), Plan(commands=[OPEN_CMD]), [])
    assert result.commands == []
    assert held == (InterlockedTarget(actuator="open", value=True, interlock="main-water", message=MESSAGE),)
    assert [reason for reason, _ in notices.posted] == ["Interlocked"]
    made._interlocked(rt, device_model("main-water-valve"), Plan(commands=[OPEN_CMD]), [])
    assert len(notices.posted) == 1, "said once"


def test_a_held_target_is_not_driven_by_itself_once_the_rule_holds_only_a_changed_one_is() -> None:
    made, rules, _ = reconciler(holds=True)
    rt = DeviceRuntime("main-water-valve")
    body = device_model("main-water-valve", status=HELD)
    result, held = made._interlocked(rt, body, Plan(commands=[OPEN_CMD]), [])
    assert result.commands == [] and [h.actuator for h in held] == ["open"]
    assert rules.asked == [], "not even judged again: the person's request was refused"
    # The target changed (say, to a position the rule does not guard): judged afresh and driven.
    other = Command("abc-g3-e0-open", "open", "set_state", False)
    result, held = made._interlocked(rt, body, Plan(commands=[other]), [])
    assert result.commands == [other] and held == ()


def test_an_executing_intents_own_command_goes_out() -> None:
    made, _rules, _ = reconciler(holds=False)
    rt = DeviceRuntime("main-water-valve")

    class PinLike:
        command_id = "i-0123456789abcdef01234567"

    pinned = Command(PinLike.command_id, "open", "set_state", True)
    result, held = made._interlocked(rt, device_model("main-water-valve", status=HELD), Plan(commands=[pinned]),
                                     [PinLike()])
    assert result.commands == [pinned] and held == ()


def test_the_device_status_says_which_rule_holds_which_target_and_lists_the_guards() -> None:
    guard = GuardingInterlock(name="main-water", actuators=["open"], condition=MAIN_WATER.condition, message=MESSAGE,
                              compiled=True)
    held = InterlockedTarget(actuator="open", value=True, interlock="main-water", message=MESSAGE)
    base = Observed(generation=2, online=True, capability="corral-valve-abc", contract_error=None, reported={},
                    sensors={}, command_epoch=0, verdict=Verdict(True, "InSync", "ok"), interlocks=(guard,))
    status = device_status(replace(base, interlocked=(held,)), None, NOW)
    found = {c.type: c for c in status.conditions}
    assert (found["Interlocked"].status, found["Interlocked"].reason) == ("True", "InterlockForbids")
    assert "spec.target.open=true is not driven: Interlock main-water forbade it" in found["Interlocked"].message
    assert (found["InSync"].status, found["InSync"].reason) == ("False", "Interlocked") and not status.in_sync
    assert status.interlocks == [guard] and status.interlocked_targets == [held]
    free = device_status(base, None, NOW)
    assert {c.type: (c.status, c.reason) for c in free.conditions}["Interlocked"] == ("False", "NoTargetHeld")
    unguarded = device_status(replace(base, interlocks=()), None, NOW)
    assert "Interlocked" not in {c.type for c in unguarded.conditions}


def test_compiled_is_a_property_of_a_compiled_rule() -> None:
    assert Compiled(MAIN_WATER, error="x").ok is False
