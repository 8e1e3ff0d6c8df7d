"""The controller's side of the failsafe, without MQTT or Kubernetes: the contract field, the heartbeat it
publishes, what it reads of a failsafe in acks and events, and how it plans and reports after one."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from corral.api.device import Device
from corral.contract.model import Contract
from corral.contract.trust import widenings
from corral.devices.heartbeat import Heartbeat, failsafes_too_soon, too_soon_note
from corral.devices.link import MqttLink
from corral.devices.messages import parse_ack, parse_event
from corral.devices.plan import PinnedCommand, plan
from corral.devices.topics import Topics
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.reconciler import DeviceReconciler
from corral.reconcile.devices.runtime import DeviceRuntime
from corral.reconcile.devices.status import Observed, device_status, sync_verdict
from corral.reconcile.devices.targets import target_set_at
from corral_sim.catalog import contract_for

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
UID = "0f3c2a9e-1111-2222-3333-444455556666"


def heater_contract(failsafe: object = None, **heater: object) -> Contract:
    spec: dict[str, object] = {"id": "heater", "name": "Heater", "type": "bool", "action": "set_state", "risk": "low",
                               "level": "write", **heater}
    if failsafe is not None:
        spec["failsafe"] = failsafe
    return Contract.model_validate({"device_id": "sht-1", "name": "Sensor", "model": "corral-sht30", "fw": "1.2.0",
                                    "actuators": [spec]})


# ---- the contract ------------------------------------------------------------------------------------------

def test_the_catalog_sht30_heater_fails_safe_to_off_after_30_s() -> None:
    contract = Contract.model_validate({**contract_for("sht30"), "device_id": "sht-1"})
    heater = contract.actuator("heater")
    assert heater is not None and heater.failsafe is not None
    assert (heater.failsafe.value, heater.failsafe.delay_s) == (False, 30)
    assert all(a.failsafe is None for a in contract.actuators if a.id != "heater")


@pytest.mark.parametrize("failsafe", [
    {"value": 0, "delay_s": 30},  # not a bool
    {"value": "off", "delay_s": 30},
    {"value": False, "delay_s": 0.5},  # shorter than 1 s
    {"value": False, "delay_s": 86401},  # longer than a day
    {"value": False},
    {"value": False, "delay_s": 30, "restore": True},  # unknown field
])
def test_a_failsafe_must_be_a_plain_value_of_its_actuator_within_sane_delays(failsafe: object) -> None:
    with pytest.raises(ValidationError, match="failsafe"):
        heater_contract(failsafe)


def test_a_numbers_failsafe_must_be_in_range_and_on_step_and_counters_and_updaters_have_none() -> None:
    number = {"type": "number", "action": "set_value", "range": {"min": 0, "max": 100}, "step": 5}
    assert heater_contract({"value": 10, "delay_s": 3}, **number).actuators[0].failsafe is not None
    for value in (12, 150):
        with pytest.raises(ValidationError, match="failsafe value"):
            heater_contract({"value": value, "delay_s": 3}, **number)
    with pytest.raises(ValidationError, match="cannot have a failsafe"):
        heater_contract({"value": 0, "delay_s": 3}, type="counter", action="feed", range={"min": 0, "max": 10})
    with pytest.raises(ValidationError, match="cannot have a failsafe"):
        heater_contract({"value": "1.2.0", "delay_s": 3}, type="enum", action="set_version", values=["1.2.0"])


def test_a_failsafe_added_changed_or_removed_holds_the_device() -> None:
    before = heater_contract({"value": False, "delay_s": 30})
    assert widenings(before, heater_contract({"value": False, "delay_s": 60})) == ["actuator heater: failsafe changed"]
    assert widenings(before, heater_contract()) == ["actuator heater: failsafe changed"]
    assert widenings(heater_contract(), before) == ["actuator heater: failsafe changed"]
    assert widenings(before, heater_contract({"value": False, "delay_s": 30})) == []


# ---- the heartbeat ---------------------------------------------------------------------------------------

def test_the_heartbeat_counts_its_beats_and_only_beats_carry_a_seq() -> None:
    heartbeat = Heartbeat.on(Topics("home"), interval_s=0.5)
    assert heartbeat.topic == "home/_corral/heartbeat"
    beats = [json.loads(heartbeat.beat()) for _ in range(3)]
    assert [b["seq"] for b in beats] == [1, 2, 3]
    assert {b["state"] for b in beats} == {"alive"} and beats[0]["interval_ms"] == 500
    assert "seq" not in json.loads(heartbeat.alive()) and json.loads(heartbeat.alive())["state"] == "alive"
    assert json.loads(heartbeat.will()) == {"state": "gone"}
    assert json.loads(heartbeat.farewell())["state"] == "gone"
    with pytest.raises(ValueError, match="positive"):
        Heartbeat.on(Topics("home"), interval_s=0)


def test_the_link_leaves_a_retained_will_gone_on_the_heartbeat_topic() -> None:
    heartbeat = Heartbeat.on(Topics("home"))
    link = MqttLink("mqtt://127.0.0.1:1883", Topics("home"), lambda message: None, heartbeat=heartbeat)
    client = link._new_client()
    assert client._will and client._will_topic == b"home/_corral/heartbeat"
    assert json.loads(client._will_payload) == {"state": "gone"}
    assert client._will_retain is True and client._will_qos == 1
    plain = MqttLink("mqtt://127.0.0.1:1883", Topics("home"), lambda message: None)._new_client()
    assert not plain._will


# ---- what a device reports -------------------------------------------------------------------------------

def test_acks_and_state_events_carry_which_actuators_sit_at_their_failsafe_value() -> None:
    record = {"value": False, "heartbeat_lost_ms": 3004, "controller": "gone", "ts": 1764500000000}
    ack = parse_ack(json.dumps({"id": "g-1", "ok": True, "error": None, "state": {"heater": False},
                                "failsafe": {"heater": record}}).encode())
    assert ack.failsafe["heater"].heartbeat_lost_ms == 3004
    assert parse_ack(b'{"id": "c", "ok": true, "state": {"heater": true}}').failsafe == {}
    event = parse_event(json.dumps({"ts": 1, "event": "state", "value": "failsafe", "seq": 3,
                                    "state": {"heater": False}, "failsafe": {"heater": record}}).encode())
    report = event.failsafe["heater"]
    assert report.cause("heater") == ("heater -> false after 3.0 s without the controller's heartbeat (the "
                                      "controller's Last Will said it was gone)")
    odd = parse_event(json.dumps({"ts": 1, "event": "state", "value": "failsafe", "state": {"heater": True},
                                  "failsafe": {"heater": {"value": False, "controller": "x" * 500,
                                                          "error": "jammed"}}}).encode())
    assert len(odd.failsafe["heater"].controller or "") <= 16, "device text is bounded, not trusted"
    assert odd.failsafe["heater"].cause("heater").endswith("but it did not move: jammed")


# ---- planning and status after a failsafe -----------------------------------------------------------------

def test_a_failsafe_value_is_drift_that_is_driven_again_unless_its_target_is_too_old() -> None:
    contract = heater_contract({"value": False, "delay_s": 30})
    common = {"uid": UID, "generation": 2, "epoch": 0, "drift": "Enforce", "reached": frozenset({"heater"})}
    again = plan(contract, {"heater": True}, {"heater": False}, **common)
    assert again.drifted == ["heater"] and again.bump_epoch, "a new epoch, so a new command id, then the drive"
    left = plan(contract, {"heater": True}, {"heater": False}, leave=frozenset({"heater"}), **common)
    assert (left.commands, left.left, left.bump_epoch, left.in_sync) == ([], ["heater"], False, False)
    assert sync_verdict(left, True, 0).reason == "FailsafeTargetTooOld"
    fresh = plan(contract, {"heater": True}, {"heater": False}, leave=frozenset({"heater"}),
                 **{**common, "epoch": 1, "reached": frozenset()})
    assert fresh.commands == [] and fresh.left == ["heater"], "not even at a new epoch"
    asked = plan(contract, {"heater": True}, {"heater": False}, leave=frozenset({"heater"}),
                 pinned=[PinnedCommand("heater", True, "intent-1")], **common)
    assert [c.id for c in asked.commands] == ["intent-1"], "an Intent asking for it anew is sent"


def test_the_failsafe_condition_says_why_and_clears_once_nothing_sits_at_a_failsafe_value() -> None:
    base = {"generation": 2, "online": True, "capability": "c-1", "contract_error": None, "reported": {},
            "sensors": {}, "command_epoch": 1, "verdict": None}
    status = device_status(Observed(**base, failsafe=("TargetTooOld", "The device moved heater -> false ...")),
                           None, T0)
    failsafe = next(c for c in status.conditions if c.type == "Failsafe")
    assert (failsafe.status, failsafe.reason) == ("True", "TargetTooOld")
    cleared = device_status(Observed(**base), status, T0 + timedelta(seconds=5))
    assert [(c.status, c.reason) for c in cleared.conditions if c.type == "Failsafe"] == [("False", "Cleared")]
    assert not [c for c in device_status(Observed(**base), None, T0).conditions if c.type == "Failsafe"]


def test_a_targets_age_comes_from_the_newest_manager_that_owns_it() -> None:
    def entry(manager: str, time: str, *fields: str) -> dict[str, object]:
        return {"manager": manager, "operation": "Apply", "time": time,
                "fieldsV1": {"f:spec": {"f:target": {f"f:{name}": {} for name in fields}}}}

    device = {"metadata": {"managedFields": [
        entry("kubectl", "2026-12-01T08:00:00Z", "heater", "fan"),
        entry("corral-intents", "2026-12-01T09:30:00Z", "heater"),
        entry("other", "2026-12-01T09:59:00Z", "fan"),
        {"manager": "corral-controller", "operation": "Update", "time": "2026-12-01T10:00:00Z",
         "fieldsV1": {"f:status": {}}},
    ]}}
    assert target_set_at(device, "heater") == datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    assert target_set_at(device, "fan") == datetime(2026, 12, 1, 9, 59, tzinfo=UTC)
    assert target_set_at(device, "light") is None
    assert target_set_at({"metadata": {}}, "heater") is None


# ---- the device reconciler's part, without its I/O ------------------------------------------------------

def reconciler(max_age_s: float = 3600.0) -> DeviceReconciler:
    """Only what the failsafe part reads: its configuration (the rest is I/O these methods do not touch)."""
    nothing: Any = None
    config = ControllerConfig(mqtt_url="mqtt://127.0.0.1:1883", redrive_max_age_s=max_age_s)
    return DeviceReconciler(config, nothing, nothing, nothing, nothing, nothing, nothing, nothing, nothing)


def heater_device(set_at: datetime, generation: int = 4, observed: int = 4, reported: bool = True) -> Device:
    return Device.model_validate({"metadata": {"name": "sht-1", "namespace": "home", "uid": UID, "generation": generation,
                         "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                            "time": set_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                            "fieldsV1": {"f:spec": {"f:target": {"f:heater": {}}}}}]},
            "spec": {"deviceId": "sht-1", "target": {"heater": True}},
            "status": {"observedGeneration": observed, "commandEpoch": 2, "reported": {"heater": reported}}})


def test_after_a_restart_a_target_that_status_shows_reached_counts_as_reached() -> None:
    now = datetime.now(UTC)
    rt = DeviceRuntime("sht-1")
    reconciler()._seed_reached(rt, heater_device(now))
    assert rt.reached_for == (UID, 4, 2) and rt.reached == {"heater"}, "a failsafe found now is drift: new epoch"
    for body in (heater_device(now, observed=3), heater_device(now, reported=False)):
        fresh = DeviceRuntime("sht-1")
        reconciler()._seed_reached(fresh, body)
        assert fresh.reached == set(), "not driven at this generation: the same command id is still right"


def test_only_a_target_older_than_the_redrive_age_is_left_at_its_failsafe_value() -> None:
    report = parse_ack(b'{"id": "g", "ok": true, "state": {"heater": false}, '
                       b'"failsafe": {"heater": {"value": false, "heartbeat_lost_ms": 3000, "ts": 5}}}').failsafe
    rt = DeviceRuntime("sht-1", failsafe=dict(report))
    old = heater_device(datetime.now(UTC) - timedelta(hours=2))
    young = heater_device(datetime.now(UTC) - timedelta(minutes=5))
    assert set(reconciler()._too_old(rt, old)) == {"heater"}
    assert reconciler()._too_old(rt, young) == {}
    assert reconciler(max_age_s=60)._too_old(rt, young).keys() == {"heater"}
    assert reconciler()._too_old(DeviceRuntime("sht-1"), old) == {}, "no failsafe, nothing left"
    reason, message = reconciler()._failsafe_condition(rt, old) or ("", "")
    assert reason == "TargetTooOld" and "was set 2.0 h ago" in message and "Set it anew" in message
    reason, message = reconciler()._failsafe_condition(rt, young) or ("", "")
    assert reason == "FailsafeApplied" and "is driven again where the interlocks allow it" in message


def test_a_failsafe_delay_of_fewer_than_three_heartbeats_is_named_with_what_to_change() -> None:
    contract = heater_contract({"value": False, "delay_s": 5})
    assert failsafes_too_soon(contract, 2.0) == {"heater": 5}, "2.5 beats: one lost beat and it trips"
    assert failsafes_too_soon(contract, 5 / 3) == {}, "exactly three beats is enough"
    assert failsafes_too_soon(heater_contract(), 30.0) == {}, "no failsafe, nothing to say"
    note = too_soon_note({"heater": 5}, 2.0)
    assert "heater after 5 s" in note and "every 2 s" in note
    assert "--heartbeat-interval (chart failsafe.heartbeatSeconds) to at most 1.66667 s" in note

