"""Checking target values against a contract: refused with what is allowed, never guessed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.contract.model import Actuator
from corral.contract.values import InvalidValue, allowed, check


def actuator(**fields: object) -> Actuator:
    return Actuator.model_validate({"id": "x", "name": "X", "risk": "low", "level": "write", **fields})


FAN = actuator(id="fan", type="enum", action="set_level", values=["off", "low", "mid", "high"])
TEMP = actuator(id="target_temp", type="number", action="set_value", range={"min": 16, "max": 30}, step=0.5, unit="°C")
POWER = actuator(id="power", type="bool", action="set_state")
COLOR = actuator(id="color", type="color", action="set_color")
FEEDER = actuator(id="feeder", type="counter", action="feed", range={"min": 0, "max": 100000})


@pytest.mark.parametrize(
    ("act", "value", "expected"),
    [(FAN, "high", "high"), (TEMP, 21.5, 21.5), (TEMP, 16, 16), (POWER, False, False), (COLOR, "#ff8800", "#ff8800"),
     (FEEDER, 12.0, 12)],
)
def test_valid_values_pass_in_their_canonical_type(act: Actuator, value: object, expected: object) -> None:
    result = check(act, value)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(
    ("act", "value", "message"),
    [
        (FAN, "turbo", 'fan (set_level) takes one of off, low, mid, high; got "turbo"'),
        (FAN, 3, "one of off, low, mid, high; got 3"),
        (TEMP, 31, "takes a number from 16 to 30 °C in steps of 0.5; got 31"),
        (TEMP, 21.3, "got 21.3 (nearest allowed: 21.5)"),
        (TEMP, True, "got true"),
        (TEMP, float("nan"), "got NaN"),
        (TEMP, "21", 'got "21"'),
        (POWER, "on", 'power (set_state) takes true or false; got "on"'),
        (POWER, 1, "takes true or false; got 1"),
        (COLOR, "#FF8800", '#rrggbb (lower-case hex); got "#FF8800"'),
        (FEEDER, 2.5, "a whole-number target total from 0 to 100000; got 2.5"),
        (FEEDER, -1, "got -1"),
    ],
)
def test_invalid_values_are_refused_saying_what_is_allowed(act: Actuator, value: object, message: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        check(act, value)
    assert message in str(refused.value)


def test_allowed_describes_each_type() -> None:
    assert allowed(POWER) == "true or false"
    assert allowed(TEMP) == "a number from 16 to 30 °C in steps of 0.5"


@given(st.integers(min_value=0, max_value=28))
def test_every_step_of_a_range_is_accepted(k: int) -> None:
    assert check(TEMP, 16 + k * 0.5) == pytest.approx(16 + k * 0.5)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.text() | st.booleans() | st.none() | st.integers())
def test_check_either_accepts_within_range_or_raises_invalid_value(value: object) -> None:
    try:
        result = check(TEMP, value)
    except InvalidValue:
        return
    assert isinstance(result, (int, float)) and 16 <= result <= 30
