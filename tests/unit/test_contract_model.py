"""Contract validation: the allow-list holds, shapes fit their types, and messages say what is allowed."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from corral.contract.canonical import capability_hash
from corral.contract.model import Contract


def contract(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "device_id": "kitchen-env-1",
        "name": "Environment sensor",
        "model": "corral-env-fan",
        "fw": "1.0.0",
        "sensors": [{"metric": "temperature", "unit": "°C", "range": {"min": -40, "max": 85}}],
        "actuators": [
            {
                "id": "fan",
                "name": "Clip fan",
                "type": "enum",
                "values": ["off", "low", "mid", "high"],
                "action": "set_level",
                "risk": "low",
                "level": "write",
            }
        ],
    }
    return {**base, **overrides}


def actuator(**fields: Any) -> dict[str, Any]:
    return {"id": "x", "name": "X", "risk": "low", "level": "write", **fields}


def test_a_valid_contract_parses() -> None:
    parsed = Contract.model_validate(contract())
    assert parsed.actuator("fan") is not None and parsed.actuator("fan").values == ["off", "low", "mid", "high"]


@pytest.mark.parametrize(
    ("bad_actuator", "message"),
    [
        (actuator(type="bool", action="toggle"), "Input should be 'set_state'"),
        (actuator(type="text", action="set_state"), "Input should be 'bool'"),
        (actuator(type="number", action="set_state"), "action 'set_state' takes type bool, not 'number'"),
        (actuator(type="enum", action="set_level"), "type enum needs a non-empty 'values' list"),
        (actuator(type="enum", action="set_mode", values=["a", "a"]), "'values' has duplicates"),
        (actuator(type="number", action="set_value"), "type number needs a 'range'"),
        (actuator(type="number", action="set_value", range={"min": 5, "max": 1}), "min 5.0 is greater than max 1.0"),
        (actuator(type="bool", action="set_state", step=1), "'step' is only for type number"),
        (actuator(type="counter", action="feed", range={"min": -1, "max": 9}), "a counter cannot go below 0"),
    ],
)
def test_contracts_outside_the_allow_list_are_refused_with_a_reason(bad_actuator: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Contract.model_validate(contract(actuators=[bad_actuator]))
    assert message in str(refused.value)


def test_control_characters_in_labels_are_removed() -> None:
    assert Contract.model_validate(contract(name="Fan\x1b[2J")).name == "Fan[2J"


def test_duplicate_actuator_ids_are_refused() -> None:
    fan = contract()["actuators"][0]
    with pytest.raises(ValidationError, match="duplicate actuator id: fan"):
        Contract.model_validate(contract(actuators=[fan, fan]))


def test_identical_devices_share_a_capability_hash_and_a_changed_shape_does_not() -> None:
    first = Contract.model_validate(contract())
    twin = Contract.model_validate(contract(device_id="bedroom-env-2", signature="c2ln"))
    assert capability_hash(first) == capability_hash(twin)
    changed = contract()
    changed["actuators"][0]["values"] = ["off", "high"]
    assert capability_hash(Contract.model_validate(changed)) != capability_hash(first)


def test_integral_and_float_numbers_hash_the_same() -> None:
    as_int = Contract.model_validate(contract())
    as_float = Contract.model_validate(
        contract(sensors=[{"metric": "temperature", "unit": "°C", "range": {"min": -40.0, "max": 85.0}}])
    )
    assert capability_hash(as_int) == capability_hash(as_float)
