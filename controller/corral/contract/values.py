"""Checking one target value against one actuator of a contract.

The controller checks every value before it reaches a device (a desired state
from `kubectl apply`, an Intent's parameters, an MCP tool call): wrong values
are refused with a message that says what is allowed, never clamped or
guessed. The firmware clamps as well, as a last line of defence.

The checks read an actuator through `ActuatorShape`, which `contract.model.Actuator` fits: the model checks its own
failsafe value with `check`, so this module does not import the model back.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Protocol

from corral.contract.allowlist import COLOR_PATTERN, ValueType

Value = bool | int | float | str

_COLOR = re.compile(COLOR_PATTERN)
# Float steps (0.5, 0.1) do not divide exactly; allow for representation error.
_STEP_TOLERANCE = 1e-9


class RangeShape(Protocol):
    """A closed interval of allowed values (contract.model.Range)."""

    @property
    def min(self) -> float: ...
    @property
    def max(self) -> float: ...


class ActuatorShape(Protocol):
    """What checking a value reads of an actuator (contract.model.Actuator)."""

    @property
    def id(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def type(self) -> ValueType: ...
    @property
    def values(self) -> Sequence[str] | None: ...
    @property
    def range(self) -> RangeShape | None: ...
    @property
    def step(self) -> float | None: ...
    @property
    def unit(self) -> str: ...


class InvalidValue(ValueError):
    """The value does not fit the actuator; str() says what is allowed."""


def allowed(actuator: ActuatorShape) -> str:
    """What the actuator accepts, in words, e.g. "one of off, low, mid, high"."""
    if actuator.type == "bool":
        return "true or false"
    if actuator.type == "enum":
        return "one of " + ", ".join(actuator.values or [])
    if actuator.type == "color":
        return "a colour as #rrggbb (lower-case hex)"
    assert actuator.range is not None
    low, high = _fmt(actuator.range.min), _fmt(actuator.range.max)
    unit = f" {actuator.unit}" if actuator.unit else ""
    if actuator.type == "counter":
        return f"a whole-number target total from {low} to {high}"
    step = f" in steps of {_fmt(actuator.step)}" if actuator.step else ""
    return f"a number from {low} to {high}{unit}{step}"


def shown(value: object) -> str:
    """A value as people and agents read it in messages: JSON, as contracts and Intents write it (true, 21.5, "auto"),
    never Python's repr (True, 'auto')."""
    return json.dumps(value, ensure_ascii=False, default=str)


def check(actuator: ActuatorShape, value: object) -> Value:
    """Return the value in its canonical JSON type, or raise InvalidValue naming what is allowed."""
    what = f"{actuator.id} ({actuator.action}) takes {allowed(actuator)}"
    if actuator.type == "bool":
        if isinstance(value, bool):
            return value
        raise InvalidValue(f"{what}; got {shown(value)}")
    if actuator.type in ("enum", "color"):
        if not isinstance(value, str):
            raise InvalidValue(f"{what}; got {shown(value)}")
        if actuator.type == "enum" and value not in (actuator.values or []):
            raise InvalidValue(f"{what}; got {shown(value)}")
        if actuator.type == "color" and not _COLOR.fullmatch(value):
            raise InvalidValue(f"{what}; got {shown(value)}")
        return value
    # number or counter; bool is an int subclass in Python but not a number here.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidValue(f"{what}; got {shown(value)}")
    assert actuator.range is not None
    if not actuator.range.min <= value <= actuator.range.max:
        raise InvalidValue(f"{what}; got {_fmt(value)}")
    if actuator.type == "counter":
        if value != int(value):
            raise InvalidValue(f"{what}; got {_fmt(value)}")
        return int(value)
    if actuator.step:
        steps = (value - actuator.range.min) / actuator.step
        if abs(steps - round(steps)) > _STEP_TOLERANCE * max(1.0, abs(steps)):
            nearest = actuator.range.min + round(steps) * actuator.step
            raise InvalidValue(f"{what}; got {_fmt(value)} (nearest allowed: {_fmt(nearest)})")
    return int(value) if isinstance(value, int) else float(value)


def _fmt(number: float | None) -> str:
    if number is None:
        return ""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def same_value(reported: object, wanted: object) -> bool:
    """Whether a value is the wanted one (1 is not True; 40 is 40.0)."""
    if isinstance(wanted, bool) or isinstance(reported, bool):
        return reported is wanted
    if isinstance(wanted, (int, float)) and isinstance(reported, (int, float)):
        return abs(float(reported) - float(wanted)) < 1e-9
    return reported == wanted
