"""A Device's status, built and coalesced without MQTT or Kubernetes; the cache's newest-wins rule; the plan
with an Intent's pinned command."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from corral.api.device import Device, DeviceStatus
from corral.contract.model import Contract, Sensor
from corral.contract.trust import judge
from corral.devices.plan import PinnedCommand, plan
from corral.devices.telemetry import Coalescing, Reading
from corral.kube.cache import ObjectCache
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.reconciler import DeviceReconciler
from corral.reconcile.devices.runtime import DeviceRuntime, StatusMemory
from corral.reconcile.devices.status import (
    Observed,
    Verdict,
    device_status,
    parse,
    remember_write,
    sensor_readings,
    sensors_due,
    serialize,
    sync_verdict,
    to_write,
    waiting_status,
)

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
TEMP = Sensor.model_validate({"metric": "temperature", "unit": "°C", "range": {"min": -40, "max": 85}})
LIGHT = Contract.model_validate({
    "device_id": "lamp", "name": "Lamp", "model": "corral-light", "fw": "1.0.0",
    "actuators": [
        {"id": "power", "name": "Power", "type": "bool", "action": "set_state", "risk": "low", "level": "write"},
        {"id": "brightness", "name": "Brightness", "type": "number", "range": {"min": 0, "max": 100},
         "action": "set_value", "risk": "low", "level": "write"},
    ],
})


def observed(**changes: object) -> Observed:
    base = dict(generation=3, online=True, capability="corral-light-abc", contract_error=None,
                reported={"power": True}, sensors={}, command_epoch=0, verdict=Verdict(True, "InSync", "ok"))
    return Observed(**{**base, **changes})


def conditions(status: DeviceStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_online_and_at_target_is_ready() -> None:
    status = device_status(observed(), None, T0)
    assert conditions(status) == {"ContractValid": ("True", "Accepted"), "ContractAccepted": ("True", "Accepted"),
                                  "InSync": ("True", "InSync"), "Ready": ("True", "Ready")}
    assert status.accepted_capability == "corral-light-abc"
    assert (status.online, status.stale, status.in_sync, status.observed_generation) == (True, False, True, 3)
    assert all(c.observed_generation == 3 for c in status.conditions)


def test_offline_keeps_the_last_state_marked_stale_and_a_refused_contract_is_inert() -> None:
    offline = device_status(observed(online=False), None, T0)
    assert conditions(offline)["Ready"] == ("False", "Offline") and offline.stale and offline.reported == {"power": True}
    refused = device_status(observed(capability=None, contract_error="actuators.0.risk: bad"), None, T0)
    assert conditions(refused) == {"ContractValid": ("False", "Refused"), "Ready": ("False", "ContractInvalid")}
    assert refused.capability is None and refused.in_sync is False


def test_pending_commands_say_what_is_applied_and_how_often_it_was_tried() -> None:
    result = plan(LIGHT, {"brightness": 40}, {"brightness": 10}, uid="u" * 12, generation=3, epoch=0, drift="Enforce")
    assert sync_verdict(result, online=True, failures=0) == Verdict(False, "Pending", "Applying brightness=40.")
    assert sync_verdict(result, online=True, failures=2).reason == "Retrying"
    assert sync_verdict(result, online=False, failures=0).reason == "DeviceOffline"


def test_transition_times_move_only_when_a_condition_flips() -> None:
    first = device_status(observed(), None, T0)
    later = device_status(observed(reported={"power": False}), first, T0 + timedelta(minutes=5))
    flipped = device_status(observed(online=False), later, T0 + timedelta(minutes=9))
    ready = {c.type: c.last_transition_time for c in later.conditions}
    assert ready["Ready"] == T0
    assert {c.type: c.last_transition_time for c in flipped.conditions}["Ready"] == T0 + timedelta(minutes=9)


def test_nothing_is_written_when_nothing_changed_and_last_seen_alone_only_when_due() -> None:
    built = device_status(observed(), None, T0)
    first = to_write(built, None, T0, last_seen_due=False)
    assert first is not None and first[1] == "changed" and first[0].last_seen == T0
    on_record = first[0]
    again = device_status(observed(), on_record, T0 + timedelta(seconds=30))
    assert to_write(again, on_record, T0 + timedelta(seconds=30), last_seen_due=False) is None
    refresh = to_write(again, on_record, T0 + timedelta(seconds=30), last_seen_due=True)
    assert refresh is not None and refresh[1] == "last-seen" and refresh[0].last_seen == T0 + timedelta(seconds=30)
    moved = device_status(observed(reported={"power": False}), on_record, T0 + timedelta(seconds=31))
    change = to_write(moved, on_record, T0 + timedelta(seconds=31, milliseconds=400), last_seen_due=False)
    assert change is not None and change[0].last_seen == T0 + timedelta(seconds=31), "lastSeen rides along, in seconds"


def test_a_status_on_record_round_trips_through_its_serialized_form() -> None:
    readings = sensor_readings({"temperature": Reading("temperature", 21.5, 1764583200123, 0.0)},
                               {"temperature": TEMP})
    status = device_status(observed(sensors=readings), None, T0)
    wire = serialize(status)
    assert wire["sensors"]["temperature"] == {"value": 21.5, "unit": "°C", "timestamp": "2025-12-01T10:00:00.123Z"}
    assert parse(wire) == status
    assert to_write(status, parse(wire), None, last_seen_due=True) is None
    assert parse({"online": True, "unknownField": 1}) is None, "a status in an unknown shape is rewritten whole"


def test_waiting_for_a_device_keeps_what_was_known() -> None:
    known = device_status(observed(reported={"power": True}, command_epoch=2), None, T0)
    waiting = waiting_status(known, 4, T0)
    assert waiting.reported == {"power": True} and waiting.command_epoch == 2 and waiting.capability == known.capability
    assert conditions(waiting) == {"ContractValid": ("Unknown", "WaitingForDevice"), "Ready": ("False", "WaitingForDevice")}
    assert (waiting.online, waiting.stale, waiting.observed_generation) == (False, True, 4)


def test_sensor_readings_are_coalesced_a_small_change_waits_for_the_interval() -> None:
    rule = Coalescing(interval_s=10, min_gap_s=2)
    memory, sensors = StatusMemory(), {"temperature": TEMP}
    latest = {"temperature": Reading("temperature", 21.0, 1, 0.0)}
    assert sensors_due(memory, latest, sensors, rule, now=100.0), "the first reading is written"
    written = device_status(observed(sensors=sensor_readings(latest, sensors)), None, T0)
    remember_write(memory, written, None, rule, now=100.0)
    assert not sensors_due(memory, latest, sensors, rule, now=200.0), "nothing changed: never"
    nudged = {"temperature": Reading("temperature", 21.4, 2, 0.0)}
    assert not sensors_due(memory, nudged, sensors, rule, now=103.0), "within the deadband: wait"
    assert sensors_due(memory, nudged, sensors, rule, now=110.5), "the interval passed"
    jumped = {"temperature": Reading("temperature", 30.0, 3, 0.0)}
    assert not sensors_due(memory, jumped, sensors, rule, now=101.0), "beyond the deadband, but within the minimum gap"
    assert sensors_due(memory, jumped, sensors, rule, now=102.5)


def body(name: str, version: str, generation: int = 1, uid: str = "u1", **spec: object) -> dict:
    return {"metadata": {"namespace": "home", "name": name, "uid": uid, "resourceVersion": version,
                         "generation": generation}, "spec": {"deviceId": name, **spec}}


def test_an_older_copy_never_overwrites_a_newer_one_and_a_deleted_object_stays_deleted() -> None:
    cache = DeviceCache()
    assert cache.upsert(body("lamp", "10")) is not None
    assert cache.upsert(body("lamp", "12", generation=2)) is not None  # our write's answer
    assert cache.upsert(body("lamp", "11")) is None, "the watch event of an older version"
    assert cache.get(("home", "lamp"))["metadata"]["resourceVersion"] == "12"
    assert cache.upsert(body("lamp", "12", generation=2)) is None, "the watch event of our own write: nothing new"
    cache.remove(body("lamp", "13", generation=2))
    assert cache.upsert(body("lamp", "12", generation=2)) is None, "a write answer that was on its way"
    assert cache.bound("lamp") == []
    assert cache.upsert(body("lamp", "20", uid="u2")) is not None, "a new object under the same name"
    assert [b["metadata"]["uid"] for b in cache.bound("lamp")] == ["u2"]


def test_only_a_spec_change_moves_the_generation_predicate() -> None:
    cache = ObjectCache()
    first = cache.upsert(body("lamp", "1"))
    labels = cache.upsert({**body("lamp", "2"), "status": {"online": True}})
    spec = cache.upsert(body("lamp", "3", generation=2, target={"power": True}))
    assert first is not None and first.generation_changed
    assert labels is not None and not labels.generation_changed
    assert spec is not None and spec.generation_changed


def test_an_intents_command_goes_out_with_its_own_id_even_at_the_value_and_never_when_superseded() -> None:
    pin = PinnedCommand("power", True, "i-abc")
    result = plan(LIGHT, {"power": True}, {"power": True}, uid="u" * 12, generation=4, epoch=0, drift="Enforce",
                  pinned=[pin])
    assert [(c.id, c.actuator, c.value) for c in result.commands] == [("i-abc", "power", True)]
    moved_on = plan(LIGHT, {"power": False}, {"power": True}, uid="u" * 12, generation=5, epoch=0, drift="Enforce",
                    pinned=[pin])
    assert moved_on.superseded == [pin]
    assert [c.id for c in moved_on.commands] == ["uuuuuuuuuuuu-g5-e0-power"]


def test_an_actuator_held_for_an_intent_gets_no_command_until_its_pin_counts() -> None:
    held = plan(LIGHT, {"power": True, "brightness": 40}, {"power": False, "brightness": 10}, uid="u" * 12,
                generation=4, epoch=0, drift="Enforce", held=frozenset({"power"}))
    assert [c.actuator for c in held.commands] == ["brightness"]


def test_a_target_held_for_someone_elses_lease_is_said_and_the_condition_ends_with_the_lease() -> None:
    held = device_status(observed(verdict=Verdict(True, "InSync", "ok"),
                                  lease_held="Not driving spec.target.power=false: leased to agent-a"), None, T0)
    assert conditions(held)["Leased"] == ("True", "TargetHeldForLease")
    assert conditions(held)["InSync"] == ("False", "Leased") and held.in_sync is False
    ended = device_status(observed(), held, T0 + timedelta(seconds=5))
    assert conditions(ended)["Leased"] == ("False", "LeaseEnded") and ended.in_sync is True
    assert conditions(device_status(observed(), ended, T0 + timedelta(seconds=9)))["Leased"] == ("False", "LeaseEnded")
    assert "Leased" not in conditions(device_status(observed(), None, T0))  # never leased: no such condition


def test_a_gone_accepted_contract_or_one_refused_mid_command_is_a_condition_not_a_crash() -> None:
    """Finding 5's AssertionError: the Device trusted a Capability that was deleted, or the contract was refused
    while a command was out. Each is said on the Device, with a reason and a message."""
    verdict = judge(LIGHT, "corral-light-new", None, "corral-light-old", None, check_versions=True)
    assert (verdict.accepted, verdict.hold_reason) == ("corral-light-old", "AcceptedContractGone")
    held = device_status(observed(capability="corral-light-new", accepted_capability="corral-light-old",
                                  hold=verdict.hold, hold_reason=verdict.hold_reason), None, T0)
    reason, message = next((c.reason, c.message) for c in held.conditions if c.type == "ContractAccepted")
    assert reason == "AcceptedContractGone" and "Capability corral-light-old) is gone" in message, message
    assert conditions(held)["InSync"] == ("False", "ContractHold")

    nothing: Any = None
    reconciler = DeviceReconciler(ControllerConfig(mqtt_url="mqtt://127.0.0.1:1883"), nothing, nothing, nothing,
                                  nothing, nothing, nothing, nothing, nothing)
    rt = DeviceRuntime("lamp", contract=None, contract_error="contract version 1 is older than the accepted version 2")
    device = Device.model_validate({"metadata": {"name": "lamp", "namespace": "home", "uid": "u1", "generation": 2},
                                    "spec": {"deviceId": "lamp", "target": {"power": True}}, "status": {}})
    result = reconciler._plan(rt, device, [])  # what drive planned after the command, once the contract was refused
    assert result.commands == []
    refused = reconciler._status(rt, device, result)
    assert conditions(refused)["ContractValid"] == ("False", "Refused")
    assert "older than the accepted version 2" in next(c.message for c in refused.conditions if c.type == "Ready")
