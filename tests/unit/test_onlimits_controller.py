"""The controller's side of an on-time limit, without MQTT or Kubernetes: what it reads of the firmware's report
in acks and events, why it does not switch the actuator on again, and what the Device's status says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import cast

from corral.api.device import Device
from corral.contract.model import Contract
from corral.devices.messages import parse_ack, parse_event
from corral.devices.plan import PinnedCommand, plan
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.onlimits import OnTimeLimits
from corral.reconcile.devices.runtime import DeviceRuntime
from corral.reconcile.devices.status import Observed, device_status, sync_verdict
from corral_sim.catalog import contract_for

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
UID = "0f3c2a9e-1111-2222-3333-444455556666"
REPORT = b'"max_on": {"relay": {"value": false, "on_ms": 5003, "max_on_s": 5, "ts": 1764500000000}}'


def relay_contract() -> Contract:
    return Contract.model_validate({**contract_for("relay"), "device_id": "relay-1"})


def relay_device(target: object = True) -> Device:
    return Device.model_validate({"metadata": {"name": "relay-1", "namespace": "home", "uid": UID, "generation": 3},
                                  "spec": {"deviceId": "relay-1", "target": {"relay": target}}})


def limited_runtime(reported: object = False) -> DeviceRuntime:
    ack = parse_ack(b'{"id": "g", "ok": true, "state": {"relay": false}, ' + REPORT + b"}")
    assert ack.max_on is not None
    rt = DeviceRuntime("relay-1", contract=relay_contract(), max_on=dict(ack.max_on))
    rt.report({"relay": reported, "firmware": "1.2.0"})
    return rt


class Posted:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.facts: list[tuple[str, dict[str, object]]] = []

    def once(self, rt: DeviceRuntime, device: Device, key: str, reason: str, action: str, note: str,
             type_: str = "Normal", fact: tuple[str, dict[str, object]] | None = None) -> None:
        if key in rt.announced:
            return
        rt.announced.add(key)
        self.events.append((reason, type_, note))
        if fact is not None:
            self.facts.append(fact)


def limits(posted: Posted | None = None) -> OnTimeLimits:
    return OnTimeLimits(cast(DeviceNotices, posted or Posted()))


# ---- the wire ------------------------------------------------------------------------------------------------

def test_acks_and_events_carry_the_limits_report_and_a_malformed_one_does_not_lose_the_message() -> None:
    event = parse_event(b'{"ts": 1, "event": "state", "value": "max_on", "seq": 4, "state": {"relay": false}, '
                        + REPORT + b"}")
    assert event.max_on is not None
    report = event.max_on["relay"]
    assert (report.value, report.on_ms, report.max_on_s) == (False, 5003, 5)
    assert report.cause("relay") == "relay -> false after 5.0 s on (its on-time limit is 5.0 s)"
    long = parse_event(b'{"ts": 1, "event": "state", "value": "max_on", "state": {"relay": false}, '
                       b'"max_on": {"relay": {"value": false, "on_ms": 14400000, "max_on_s": 14400, "ts": 2}}}')
    assert long.max_on is not None and "after 4.0 h on (its on-time limit is 4.0 h)" in long.max_on["relay"].cause("relay")
    broken = parse_ack(b'{"id": "c", "ok": true, "state": {"relay": false}, "max_on": {"relay": "yes"}}')
    assert broken.ok and broken.state == {"relay": False} and broken.max_on is None
    assert parse_ack(b'{"id": "c", "ok": true, "state": {"relay": true}}').max_on is None


# ---- planning: the limit is not undone -------------------------------------------------------------------------

def test_an_actuator_the_limit_switched_off_is_not_switched_on_again_except_by_an_intents_command() -> None:
    contract = relay_contract()
    common = {"uid": UID, "generation": 3, "epoch": 0, "drift": "Enforce", "reached": frozenset({"relay"})}
    undone = plan(contract, {"relay": True}, {"relay": False}, **common)
    assert undone.drifted == ["relay"], "without the rule, the limit's off would be driven back on"
    kept = plan(contract, {"relay": True}, {"relay": False}, limited=frozenset({"relay"}), **common)
    assert (kept.commands, kept.limited, kept.bump_epoch, kept.in_sync) == ([], ["relay"], False, False)
    verdict = sync_verdict(kept, True, 0)
    assert verdict.reason == "OnTimeLimit" and "condition OnTimeLimit" in verdict.message
    asked = plan(contract, {"relay": True}, {"relay": False}, limited=frozenset({"relay"}),
                 pinned=[PinnedCommand("relay", True, "intent-7")], **common)
    assert [c.id for c in asked.commands] == ["intent-7"], "a new request is sent (and judged like any other)"


def test_only_an_on_target_of_an_actuator_reported_off_by_its_limit_is_left() -> None:
    rt = limited_runtime()
    assert limits().limited(rt, relay_device(True)) == {"relay"}
    assert limits().limited(rt, relay_device(False)) == frozenset(), "an off target: nothing to leave"
    assert limits().limited(limited_runtime(reported=True), relay_device(True)) == frozenset(), "on again already"
    assert limits().limited(DeviceRuntime("relay-1", contract=relay_contract()), relay_device(True)) == frozenset()
    jammed = limited_runtime(reported=True)
    jammed.max_on = {"relay": jammed.max_on["relay"].model_copy(update={"error": "jammed"})}
    assert limits().limited(jammed, relay_device(True)) == frozenset()


# ---- what people see --------------------------------------------------------------------------------------------

def test_an_event_and_an_audit_record_once_per_report() -> None:
    posted = Posted()
    rt = limited_runtime()
    for _ in range(3):
        limits(posted).announce(rt, relay_device())
    assert len(posted.events) == 1 and len(posted.facts) == 1
    reason, type_, note = posted.events[0]
    assert (reason, type_) == ("OnTimeLimit", "Warning")
    assert note == "The device switched relay -> false after 5.0 s on (its on-time limit is 5.0 s) by itself."
    kind, data = posted.facts[0]
    assert kind == "device.max_on" and data["actuator"] == "relay" and data["on_ms"] == 5003
    assert data["max_on_s"] == 5 and data["value"] is False


def test_the_condition_names_the_limit_and_what_switches_it_on_again_and_then_clears() -> None:
    rt = limited_runtime()
    reason, message = limits().condition(rt, relay_device(True)) or ("", "")
    assert reason == "LimitReached"
    assert "relay -> false after 5.0 s on (its on-time limit is 5.0 s)" in message
    assert "spec.target.relay=true is not driven again by itself" in message and "Intent" in message
    assert limits().condition(DeviceRuntime("relay-1"), relay_device()) is None
    base = {"generation": 3, "online": True, "capability": "c-1", "contract_error": None, "reported": {},
            "sensors": {}, "command_epoch": 1, "verdict": None}
    status = device_status(Observed(**base, max_on=(reason, message)), None, T0)
    condition = next(c for c in status.conditions if c.type == "OnTimeLimit")
    assert (condition.status, condition.reason, condition.message) == ("True", "LimitReached", message)
    cleared = device_status(Observed(**base), status, T0 + timedelta(seconds=5))
    assert [(c.status, c.reason) for c in cleared.conditions if c.type == "OnTimeLimit"] == [("False", "Cleared")]
    assert not [c for c in device_status(Observed(**base), None, T0).conditions if c.type == "OnTimeLimit"]
