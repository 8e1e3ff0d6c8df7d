"""One deterministic state machine per actuator: a value, and the only way to change it.

An actuator holds one value of its contract type. A command names a target;
`resolve` turns the requested target into the value that will be applied (or
refuses it), and `apply` moves the state there. Nothing depends on anything but
the contract, the current value and the request, so the same sequence of
commands always yields the same states.

- bool:    true / false, nothing else (not 0/1, not "on").
- enum:    one of the contract's values, nothing else.
- number:  clamped to the range, then rounded half-up to the nearest step.
- color:   "#rrggbb", lower-case hex, nothing else.
- counter: a target total, clamped to the range; applying it executes
           max(0, target - total) units, so repeating a target does nothing more.

Values that can be clamped (numbers, counters) are; values that cannot (an enum
value not listed, a wrong type) raise Refused with a message that says what is
allowed.
"""

import json

HEX_DIGITS = "0123456789abcdef"
INF = float("inf")
SHOWN_CHARS = 64


class Refused(Exception):
    """A request that cannot be turned into a value of the actuator."""


def show(value) -> str:
    """A requested value as an error message quotes it: JSON-ish and bounded."""
    if type(value) is str:
        text = "'" + value[:SHOWN_CHARS] + "'"
        return text if len(value) <= SHOWN_CHARS else text + "..."
    try:
        text = json.dumps(value)
    except Exception:
        text = "?"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def is_number(value) -> bool:
    """A JSON number: int or float, finite, not a bool (MicroPython's bool is no int subclass; CPython's is)."""
    t = type(value)
    if t is int:
        return True
    if t is float:
        return value == value and value != INF and value != -INF
    return False


def tidy(value):
    """Whole numbers as int, others without binary noise (0.30000000000000004 -> 0.3)."""
    if value == int(value):
        return int(value)
    return round(value, 9)


def round_to_step(value, low, high, step):
    """value (already within [low, high]) rounded half-up to low + k*step, kept within [low, high]."""
    k = int((value - low) / step + 0.5)
    rounded = low + k * step
    if rounded > high:
        rounded = low + (k - 1) * step
    return tidy(rounded)


class Actuator:
    """The common part: identity, contract spec, current value."""

    def __init__(self, spec: dict):
        self.id = spec["id"]
        self.type = spec["type"]
        self.action = spec["action"]
        self.spec = spec
        self.value = None

    def resolve(self, requested):
        """The value to apply for a requested target: returns (applied, clamped) or raises Refused."""
        raise NotImplementedError

    def units_for(self, applied) -> int:
        """How much applying this value executes: 1, or a counter's increment."""
        return 1

    def apply(self, applied) -> int:
        """Move to the applied value; returns the units executed."""
        self.value = applied
        return 1

    def _wrong_type(self, expected: str, requested):
        return Refused("actuator '" + self.id + "' takes " + expected + ", not " + show(requested))


class BoolActuator(Actuator):
    def __init__(self, spec: dict):
        super().__init__(spec)
        self.value = False

    def resolve(self, requested):
        if type(requested) is not bool:
            raise self._wrong_type("true or false", requested)
        return requested, False


class EnumActuator(Actuator):
    def __init__(self, spec: dict, firmware_version: str = ""):
        super().__init__(spec)
        self.values = spec["values"]
        # A firmware updater starts at the version it runs; other enums at their first value.
        if self.action == "set_version" and firmware_version in self.values:
            self.value = firmware_version
        else:
            self.value = self.values[0]

    def resolve(self, requested):
        if type(requested) is not str or requested not in self.values:
            raise Refused(
                "value " + show(requested) + " is not allowed for actuator '" + self.id + "'; allowed: "
                + ", ".join(self.values)
            )
        return requested, False


class NumberActuator(Actuator):
    def __init__(self, spec: dict):
        super().__init__(spec)
        self.low = spec["range"]["min"]
        self.high = spec["range"]["max"]
        self.step = spec.get("step")
        # Start at the allowed value nearest to zero (0 % brightness, the lowest set-point, ...).
        self.value, _ = self.resolve(0)

    def resolve(self, requested):
        if not is_number(requested):
            raise self._wrong_type("a number", requested)
        applied = min(max(requested, self.low), self.high)
        if self.step:
            applied = round_to_step(applied, self.low, self.high, self.step)
        else:
            applied = tidy(applied)
        return applied, applied != requested


class ColorActuator(Actuator):
    def __init__(self, spec: dict):
        super().__init__(spec)
        self.value = "#ffffff"

    def resolve(self, requested):
        if not is_color(requested):
            raise self._wrong_type("a colour as '#rrggbb' (lower-case hex)", requested)
        return requested, False


class CounterActuator(Actuator):
    """A momentary action (feed, dispense, pack) kept idempotent: the state is the total executed."""

    def __init__(self, spec: dict, total: int = 0):
        super().__init__(spec)
        self.low = int(spec["range"]["min"])
        self.high = int(spec["range"]["max"])
        self.value = total

    def resolve(self, requested):
        if not is_number(requested) or requested != int(requested):
            raise self._wrong_type("a whole number (the target total)", requested)
        target = min(max(int(requested), self.low), self.high)
        return target, target != requested

    def units_for(self, target: int) -> int:
        return max(0, target - self.value)

    def apply(self, applied) -> int:
        units = self.units_for(applied)
        self.value += units
        return units


def is_color(value) -> bool:
    if type(value) is not str or len(value) != 7 or value[0] != "#":
        return False
    for ch in value[1:]:
        if ch not in HEX_DIGITS:
            return False
    return True


FAILSAFE_MIN_DELAY_S = 1
FAILSAFE_MAX_DELAY_S = 86400


def failsafe_of(actuator: Actuator):
    """The actuator's failsafe from its contract as (value, delay_ms), or None; ValueError when it is not one.

    The same rules as the controller's contract model: a valid value of the actuator exactly as it would be
    applied (not clamped, not rounded), after 1 to 86400 seconds; never on a counter or a firmware updater.
    """
    failsafe = actuator.spec.get("failsafe")
    if failsafe is None:
        return None
    where = "actuator '" + actuator.id + "': failsafe "
    if type(failsafe) is not dict or "value" not in failsafe or "delay_s" not in failsafe:
        raise ValueError(where + "must be an object with 'value' and 'delay_s'")
    if actuator.type == "counter" or actuator.action == "set_version":
        raise ValueError(where + "is not allowed on a " + actuator.action + " actuator")
    delay = failsafe["delay_s"]
    if not is_number(delay) or not FAILSAFE_MIN_DELAY_S <= delay <= FAILSAFE_MAX_DELAY_S:
        raise ValueError(where + "delay_s must be a number of seconds from 1 to 86400, not " + show(delay))
    value = failsafe["value"]
    try:
        applied, clamped = actuator.resolve(value)
    except Refused as refusal:
        raise ValueError(where + "value: " + str(refusal)) from None
    if clamped:
        raise ValueError(where + "value " + show(value) + " is not a value the actuator takes as it is")
    return applied, int(delay * 1000)


MAX_ON_MIN_S = 1
MAX_ON_MAX_S = 86400


def off_value_of(actuator: Actuator):
    """What "off" is for an on-time limit: False for a bool, "off" for an enum listing it; None: no off value."""
    if actuator.type == "bool":
        return False
    if actuator.type == "enum" and "off" in actuator.spec.get("values", ()):
        return "off"
    return None


def max_on_of(actuator: Actuator):
    """The actuator's on-time limit from its contract as (off value, limit_ms), or None; ValueError when it is not
    one. The same rules as the controller's contract model: 1 to 86400 seconds, on an actuator with an off value."""
    limit = actuator.spec.get("max_on_seconds")
    if limit is None:
        return None
    where = "actuator '" + actuator.id + "': max_on_seconds "
    if not is_number(limit) or not MAX_ON_MIN_S <= limit <= MAX_ON_MAX_S:
        raise ValueError(where + "must be a number of seconds from 1 to 86400, not " + show(limit))
    off = off_value_of(actuator)
    if off is None:
        raise ValueError(where + "needs an off value: type bool, or an enum with the value 'off'")
    return off, int(limit * 1000)


def make_actuator(spec: dict, firmware_version: str = "", counter_total: int = 0) -> Actuator:
    kind = spec["type"]
    if kind == "bool":
        return BoolActuator(spec)
    if kind == "enum":
        return EnumActuator(spec, firmware_version)
    if kind == "number":
        return NumberActuator(spec)
    if kind == "color":
        return ColorActuator(spec)
    if kind == "counter":
        return CounterActuator(spec, counter_total)
    raise ValueError("actuator '" + spec["id"] + "': unknown type '" + str(kind) + "'")
