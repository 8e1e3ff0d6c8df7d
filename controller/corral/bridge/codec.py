"""From Corral commands to a bridged device's own payloads, and from its state messages back to values. Pure.

mapping.derive builds one `DeviceCodec` per device together with its contract:

- `DeviceCodec.command(actuator, value)` checks the value against the contract (contract/values.py `check`: a
  wrong type, an enum value not listed, a number out of range or off its step is refused before anything is
  published; there is nothing left to clamp) and returns the one `Publish` to send: the device's command topic and
  payload (payload_on/off, payload_lock/unlock, a json-schema light's `{"state": "ON", "brightness": 120}`, a
  command template rendered with the value). Commands are never retained, whatever the discovery says: a retained
  command would be replayed to the device on every reconnect.
- `DeviceCodec.read(topic, payload)` turns one state message into actuator values (`state`) and sensor readings
  (`readings`), using the component's templates (value_template, state_value_template, brightness_value_template,
  ...; only the safe subset, bridge/templates.py) and its state payloads (state_on/off, state_locked/unlocked,
  state_open/closed). A value the device reports that the contract does not know (a lock "JAMMED", a cover
  "opening") is no value at all: it is skipped, never guessed.
- `DeviceCodec.confirms(actuator, requested, observed)`: bool and enum exactly; a number within half a step
  (a device that rounds to its own step reports the nearest value; with no step declared, within 1% of the range).
  A brightness of 120 read back as 119 therefore does not confirm, since brightness has step 1.

Everything device-supplied stays data: payloads are decoded as UTF-8 and compared or parsed, never executed.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.bridge import templates
from corral.contract.model import Actuator, Sensor
from corral.contract.values import InvalidValue, Value, check, same_value, shown

__all__ = ["ActuatorCodec", "Availability", "AvailabilityTopic", "DeviceCodec", "InvalidValue", "Observed",
           "Publish", "Reader", "SensorCodec", "TemplateRefused", "extract", "render"]


class TemplateRefused(ValueError):
    """A template beyond the safe subset (bridge/templates.py); str() is templates' sentence naming it."""


@functools.lru_cache(maxsize=1024)
def value_template(text: str) -> templates.ValueTemplate:
    compiled = templates.compile_value(text)
    if isinstance(compiled, templates.Refusal):
        raise TemplateRefused(compiled.reason)
    return compiled


@functools.lru_cache(maxsize=1024)
def command_template(text: str, variables: tuple[str, ...] = ("value",)) -> templates.CommandTemplate:
    compiled = templates.compile_command(text, variables)
    if isinstance(compiled, templates.Refusal):
        raise TemplateRefused(compiled.reason)
    return compiled

# A state message larger than this is not a state message (a flood or a mistake): it is not parsed.
MAX_STATE_BYTES = 64 * 1024


def extract(template: str | None, text: str) -> object:
    """The value a state template extracts from a payload (the payload itself without a template); None when the
    payload does not have it. Only the safe subset is evaluated (templates.py)."""
    if not template:
        return text
    return value_template(template).extract(text)


def render(template: str, variables: Mapping[str, object], allowed: tuple[str, ...] | None = None) -> str:
    """A command template rendered with its variables (`value`, or a light's `state`, `brightness`, ...);
    `allowed`: the names the template may use (default: those given; a template light's sections name others).
    TemplateRefused beyond the subset; templates.RenderError (a ValueError) when it needs a variable not given."""
    names = allowed if allowed is not None else tuple(sorted(variables))
    return command_template(template, names).render_with(variables)


@dataclass(frozen=True)
class Publish:
    """One MQTT message for the device: published once, not retained."""

    topic: str
    payload: bytes
    qos: int = 0


@dataclass(frozen=True, eq=False)
class Reader:
    """Reads one value out of the messages on one topic: `decode` takes the payload text and returns the value in
    the contract's terms, or None when the message does not carry one the contract knows."""

    topic: str
    decode: Callable[[str], Value | None]


@dataclass(frozen=True, eq=False)
class ActuatorCodec:
    actuator: Actuator
    topic: str
    encode: Callable[[Value], str]  # the checked value -> the payload text
    readers: tuple[Reader, ...]
    qos: int = 0

    def command(self, value: object) -> Publish:
        checked = check(self.actuator, value)
        try:
            payload = self.encode(checked)
        except ValueError as err:  # a command template whose filters cannot take this value (templates.py)
            raise InvalidValue(f"{self.actuator.id}: the device's command template cannot carry {shown(checked)}: "
                               f"{err}") from None
        return Publish(self.topic, payload.encode(), self.qos)

    def confirms(self, requested: object, observed: object) -> bool:
        return confirms(self.actuator, requested, observed)


@dataclass(frozen=True, eq=False)
class SensorCodec:
    sensor: Sensor
    readers: tuple[Reader, ...]


@dataclass(frozen=True)
class Observed:
    """What one state message says: actuator id -> value, metric -> reading."""

    state: dict[str, Value] = field(default_factory=dict)
    readings: dict[str, Value] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.state or self.readings)


@dataclass(frozen=True)
class AvailabilityTopic:
    topic: str
    payload_available: str = "online"
    payload_not_available: str = "offline"
    value_template: str | None = None

    def read(self, payload: bytes) -> bool | None:
        """True online, False offline, None for anything else (ignored)."""
        text = _text(payload)
        if text is None:
            return None
        try:
            value = extract(self.value_template, text)
        except ValueError:  # TemplateRefused, or a payload the template cannot read
            return None
        said = _as_text(value)
        if said == self.payload_available:
            return True
        if said == self.payload_not_available:
            return False
        return None


@dataclass(frozen=True)
class Availability:
    """A device's availability topics and how Home Assistant combines them (availability_mode)."""

    topics: tuple[AvailabilityTopic, ...] = ()
    mode: str = "latest"  # all | any | latest

    def online(self, seen: Mapping[str, bool], latest: bool | None) -> bool | None:
        """Online or not from what each topic last said (`seen`) and the last thing any topic said (`latest`).
        None: no availability topic, or none heard yet (the caller decides; the bridge says online while it
        hears the device's state, see docs/bridge.md)."""
        if not self.topics:
            return None
        heard = [seen[t.topic] for t in self.topics if t.topic in seen]
        if not heard:
            return None
        if self.mode == "all":
            # A topic never heard is not counted: zigbee2mqtt lists a device's availability topic even when
            # its availability feature is off (bridge/exposes.py), and then only the bridge state is heard.
            return all(heard)
        if self.mode == "any":
            return any(heard)
        return latest


@dataclass(frozen=True, eq=False)
class DeviceCodec:
    actuators: Mapping[str, ActuatorCodec] = field(default_factory=dict)
    sensors: Mapping[str, SensorCodec] = field(default_factory=dict)
    availability: Availability = Availability()

    def command(self, actuator_id: str, value: object) -> Publish:
        """The message that sets `actuator_id` to `value`. Raises KeyError for an unknown actuator and
        InvalidValue (its message says what is allowed) for a value the contract refuses."""
        return self.actuators[actuator_id].command(value)

    def read(self, topic: str, payload: bytes) -> Observed:
        text = _text(payload)
        out = Observed()
        if text is None:
            return out
        for actuator_id, codec in self.actuators.items():
            for reader in codec.readers:
                if reader.topic == topic:
                    value = _decoded(reader, text)
                    if value is not None:
                        out.state[actuator_id] = value
        for metric, sensor in self.sensors.items():
            for reader in sensor.readers:
                if reader.topic == topic:
                    value = _decoded(reader, text)
                    if value is not None:
                        out.readings[metric] = value
        return out

    def confirms(self, actuator_id: str, requested: object, observed: object) -> bool:
        return self.actuators[actuator_id].confirms(requested, observed)

    def command_topics(self) -> tuple[str, ...]:
        return tuple(sorted({c.topic for c in self.actuators.values()}))

    def state_topics(self) -> tuple[str, ...]:
        readers = [r for c in self.actuators.values() for r in c.readers]
        readers += [r for s in self.sensors.values() for r in s.readers]
        return tuple(sorted({r.topic for r in readers}))

    def availability_topics(self) -> tuple[str, ...]:
        return tuple(sorted({t.topic for t in self.availability.topics}))


def confirms(actuator: Actuator, requested: object, observed: object) -> bool:
    """Whether an observed value shows the requested one (see the module for the tolerance)."""
    if actuator.type in ("number", "counter"):
        if isinstance(requested, bool) or isinstance(observed, bool):
            return False
        if not isinstance(requested, (int, float)) or not isinstance(observed, (int, float)):
            return False
        if actuator.step:
            tolerance = actuator.step / 2
        elif actuator.range is not None:
            tolerance = (actuator.range.max - actuator.range.min) / 100
        else:
            tolerance = 0.0
        return abs(float(observed) - float(requested)) <= tolerance + 1e-9
    return same_value(observed, requested)


def _decoded(reader: Reader, text: str) -> Value | None:
    try:
        return reader.decode(text)
    except (TemplateRefused, ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError):
        return None  # ArithmeticError: a number beyond float's range is no value (templates._in_range)


def _text(payload: bytes) -> str | None:
    if len(payload) > MAX_STATE_BYTES:
        return None
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _as_text(value: object) -> str | None:
    """A template's result as the text the state payloads are compared with (HA compares rendered strings)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float) and value.is_integer():
        return str(value)
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


# Decoders: each turns a payload text into a value in the contract's terms, or None.

def matcher(template: str | None, table: Mapping[str, Value]) -> Callable[[str], Value | None]:
    """A value from a table of state payloads (state_on -> True, "LOCKED" -> True, "eco" -> "eco")."""
    def decode(text: str) -> Value | None:
        said = _as_text(extract(template, text))
        return None if said is None else table.get(said)
    return decode


def number(template: str | None, convert: Callable[[float], float] = lambda x: x,
           ) -> Callable[[str], Value | None]:
    """A finite number (a JSON number, or text that reads as one), converted to the contract's scale."""
    def decode(text: str) -> Value | None:
        value = as_number(extract(template, text))
        converted = None if value is None else convert(value)  # a scale may overflow a finite value to inf
        return tidy(converted) if converted is not None and math.isfinite(converted) else None
    return decode


def json_field(key: str, then: Callable[[object], Value | None]) -> Callable[[str], Value | None]:
    """A field of a JSON object payload (a json-schema light's state)."""
    def decode(text: str) -> Value | None:
        data = json.loads(text)
        if not isinstance(data, dict) or key not in data:
            return None
        return then(data[key])
    return decode


def as_number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            number = float(value.strip())
        else:
            return None
    except (ValueError, OverflowError):  # not a number, or an integer too large for a float
        return None
    return number if math.isfinite(number) else None


def tidy(number: float) -> Value:
    """Whole numbers as int (what the contract's JSON shows), others as float."""
    return int(number) if float(number).is_integer() else number


def payload_text(value: Any) -> str:
    """A number as a device expects it in a plain payload: 120, not 120.0."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

