"""Planning commands toward a target: deterministic ids, refusals, drift handling."""

from __future__ import annotations

from corral.contract.model import Contract
from corral.devices.plan import command_id, plan

CONTRACT = Contract.model_validate(
    {
        "device_id": "lamp-1",
        "name": "Lamp",
        "model": "corral-light",
        "fw": "1.0.0",
        "actuators": [
            {"id": "power", "name": "Power", "type": "bool", "action": "set_state", "risk": "low", "level": "write"},
            {"id": "brightness", "name": "Brightness", "type": "number", "action": "set_value",
             "range": {"min": 0, "max": 100}, "step": 1, "risk": "low", "level": "write"},
        ],
    }
)
UID = "0f3c2a9e-1111-2222-3333-444455556666"


def make(target: dict, reported: dict, **kw: object):
    args = {"uid": UID, "generation": 3, "epoch": 0, "drift": "Enforce", **kw}
    return plan(CONTRACT, target, reported, **args)


def test_only_differing_actuators_get_commands_with_deterministic_ids() -> None:
    result = make({"power": True, "brightness": 40}, {"power": True, "brightness": 10})
    assert [(c.actuator, c.value) for c in result.commands] == [("brightness", 40)]
    assert result.commands[0].id == command_id(UID, 3, 0, "brightness") == "0f3c2a9e1111-g3-e0-brightness"
    assert make({"brightness": 40}, {}).commands[0].id == result.commands[0].id  # the same after a restart
    assert result.commands[0].payload() == {
        "id": "0f3c2a9e1111-g3-e0-brightness", "cmd": "set_value", "params": {"actuator": "brightness", "value": 40}
    }


def test_a_new_generation_or_epoch_gives_a_new_id() -> None:
    ids = {make({"brightness": 40}, {}, generation=g, epoch=e).commands[0].id for g in (3, 4) for e in (0, 1)}
    assert len(ids) == 4


def test_in_sync_when_reported_matches_target_with_numeric_tolerance_but_not_bool_for_int() -> None:
    assert make({"power": True, "brightness": 40}, {"power": True, "brightness": 40.0}).in_sync
    assert not make({"power": True}, {"power": 1}).in_sync


def test_invalid_targets_are_refused_not_sent() -> None:
    result = make({"brightness": 140, "fan": "high", "power": True}, {"power": False})
    assert [c.actuator for c in result.commands] == ["power"]
    assert "takes a number from 0 to 100" in result.invalid["brightness"]
    assert "no actuator 'fan' (actuators: power, brightness)" in result.invalid["fan"]
    assert not result.in_sync


def test_drift_under_enforce_asks_for_a_new_epoch_before_any_command() -> None:
    result = make({"power": True}, {"power": False}, reached=frozenset({"power"}))
    assert result.drifted == ["power"] and result.bump_epoch and result.commands == []


def test_drift_under_observe_is_recorded_and_left_alone() -> None:
    result = make({"power": True}, {"power": False}, reached=frozenset({"power"}), drift="Observe")
    assert result.drifted == ["power"] and not result.bump_epoch and result.commands == []
    assert not result.in_sync
