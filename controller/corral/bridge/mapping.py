"""From one discovered device to a Corral contract, its codec and its topics. Pure.

`derive(discovered, risk_overrides)` maps each Home Assistant component through the allow-list
(contract/allowlist.py): only the kinds listed in docs/bridge.md ("What maps and what does not") become actuators
or sensors; everything else is returned in `left_out`, each with a reason a person can act on. Ranges, steps,
options and units come from the configuration; risk from the documented table (risk.py), overridden per Device by
a person. Ids are derived deterministically (the same discovery gives the same contract, so its hash is stable):
sorted by component and object id, slugged to the identifier pattern, collisions numbered.

All device text (names, models, units, options) is data: names and units go through contract/text.py (the
contract models apply it), enum values and ids are reduced to their strict ASCII patterns, and what no pattern
can hold is left out, named.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from corral.bridge import codec as c
from corral.bridge.discovery import RESERVED_TOPIC_PREFIXES
from corral.bridge.model import Component, Discovered, LeftOut
from corral.bridge.risk import RiskRule, apply_overrides, risk_for
from corral.contract.allowlist import ActionKind, ValueType
from corral.contract.model import (
    DEVICE_ID_PATTERN,
    ENUM_VALUE_PATTERN,
    SENSOR_MAX_INTERVAL_S,
    SENSOR_MIN_INTERVAL_S,
    Actuator,
    ActuatorLevel,
    Contract,
    Range,
    Sensor,
)
from corral.contract.text import bounded, quoted_data, safe_text
from corral.contract.values import Value

FALLBACK_FW = "0.0.0+bridged"
_SEMVER = re.compile(r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]{1,32})?$")
_ENUM = re.compile(ENUM_VALUE_PATTERN)
_DEVICE_ID = re.compile(DEVICE_ID_PATTERN)
MAX_ITEMS = 64  # actuators and sensors per contract (contract.model)
_QUOTE = 80  # how much of a device's text a reason quotes
# What a template light's command templates may name (Home Assistant's variables for them; the bridge gives
# `state` always and `brightness` / `color_temp` when it sets them, so other names stay in undefined sections).
LIGHT_VARIABLES = ("brightness", "color_temp", "flash", "transition", "state", "red", "green", "blue", "hue", "sat",
                   "effect")


@dataclass(frozen=True)
class Topics:
    """The device's own topics: what the bridge publishes to and listens on (and the broker ACLs grant)."""

    command: tuple[str, ...] = ()
    state: tuple[str, ...] = ()
    availability: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Derived:
    """What derive() makes of one discovered device."""

    contract: Contract
    codec: c.DeviceCodec
    topics: Topics
    left_out: tuple[LeftOut, ...] = ()
    risk_reasons: Mapping[str, str] = field(default_factory=dict)  # actuator id -> why its risk is what it is
    unknown_overrides: tuple[str, ...] = ()  # risk override keys that name no actuator (or no risk)


# ---- drafts: what a component contributes before ids are assigned ------------------------------------------

@dataclass(eq=False)
class _Act:
    wanted: str
    component: Component
    capability: str
    name: str
    type: ValueType
    action: ActionKind
    topic: str
    encode: Callable[[Value], str]
    readers: list[tuple[str, Callable[[str], Value | None]]]
    description: str
    values: list[str] | None = None
    range: tuple[float, float] | None = None
    step: float | None = None
    unit: str = ""


@dataclass(eq=False)
class _Sen:
    wanted: str
    component: Component
    name: str
    readers: list[tuple[str, Callable[[str], Value | None]]]
    unit: str = ""
    range: tuple[float, float] | None = None
    description: str = ""


class _Out(Exception):
    """A component (or a part of it) that does not map; the message is the reason."""


@dataclass
class _Drafts:
    acts: list[_Act] = field(default_factory=list)
    sens: list[_Sen] = field(default_factory=list)
    left: list[LeftOut] = field(default_factory=list)

    def leave(self, comp: Component, part: str, reason: str) -> None:
        self.left.append(LeftOut(_what(comp, part), reason))


def _what(comp: Component, part: str = "") -> str:
    name = f"{comp.component}.{bounded(comp.object_id, 64)}"
    return f"{name} ({part})" if part else name


# ---- small readers of a configuration ----------------------------------------------------------------------

def _s(cfg: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = cfg.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool):
        return "True" if value else "False"  # HA reads YAML booleans as these strings for payloads
    if isinstance(value, (str, int, float)):
        return str(value)
    raise _Out(f"its {key} is not text")


def _n(cfg: Mapping[str, Any], key: str, default: float) -> float:
    value = cfg.get(key, default)
    number = c.as_number(value)
    if number is None:
        raise _Out(f"its {key} is not a number: {quoted_data(str(value), _QUOTE)}")
    return number


def _topic(cfg: Mapping[str, Any], key: str) -> str | None:
    value = cfg.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or any(ch in value for ch in "#+\x00") or len(value) > 512:
        raise _Out(f"its {key} is not a plain MQTT topic: {quoted_data(str(value), _QUOTE)}")
    if value.startswith(RESERVED_TOPIC_PREFIXES):
        # Accepting the device grants the bridge these topics: never Corral's own device protocol or the broker's.
        raise _Out(f"its {key} {quoted_data(value, _QUOTE)} lies in a reserved namespace "
                   f"({', '.join(RESERVED_TOPIC_PREFIXES)})")
    return value


def _template(cfg: Mapping[str, Any], key: str, probe: Mapping[str, object] | None = None,
              allowed: tuple[str, ...] | None = None) -> str | None:
    """A template of the safe subset, or _Out naming why not. `probe`: a command template is rendered once with
    these variables to see that it stays within the subset; a value template is tried on an empty object."""
    value = cfg.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _Out(f"its {key} is not text")
    try:
        if probe is None:
            c.value_template(value)
        else:
            c.render(value, probe, allowed)
    except c.TemplateRefused as err:
        raise _Out(f"{key}: {err}") from None
    except ValueError as err:  # a command template that needs a variable the bridge does not have
        raise _Out(f"its {key} {quoted_data(value, _QUOTE)} cannot be rendered: {err}") from None
    return value


def _qos(cfg: Mapping[str, Any]) -> int:
    qos = cfg.get("qos", 0)
    return 1 if qos in (1, 2) else 0  # the bridge sends at most at QoS 1: once, not retried by the broker twice


def _encode_template(template: str | None, extra: Mapping[str, object] | None = None) -> Callable[[Value], str]:
    if template is None:
        return c.payload_text
    return lambda value: c.render(template, {**(extra or {}), "value": value})


def _name(comp: Component, suffix: str = "") -> str:
    raw = comp.config.get("name")
    base = safe_text(raw) if isinstance(raw, str) else ""
    if not base and "name" in comp.config:
        # `name: null` is Home Assistant's "the device's own name" (zigbee2mqtt's main light, switch or lock).
        base = safe_text(comp.device.name)
    base = base or safe_text(comp.object_id) or comp.component
    return bounded(f"{base} {suffix}".strip(), 64)


def _bool_table(on: str | None, off: str | None) -> dict[str, Value]:
    table: dict[str, Value] = {}
    if off is not None:
        table[off] = False
    if on is not None:
        table[on] = True
    return table


def _needs_state(comp: Component, topic: str | None, what: str) -> str:
    if topic is None:
        raise _Out(f"it reports no {what} (no state topic), so a command could never be confirmed")
    return topic


def _command_and_state(comp: Component, what: str) -> tuple[str, str]:
    """Its command topic and the state topic that reports `what`: without either it is left out (nothing could be
    set, or a command could never be confirmed)."""
    cmd = _topic(comp.config, "command_topic")
    if cmd is None:
        raise _Out("it has no command_topic: nothing can be set")
    return cmd, _needs_state(comp, _topic(comp.config, "state_topic"), what)


# ---- the components ----------------------------------------------------------------------------------------

def _switch(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    cmd, state = _command_and_state(comp, "state")
    on, off = _s(cfg, "payload_on", "ON"), _s(cfg, "payload_off", "OFF")
    tpl = _template(cfg, "value_template")
    table = _bool_table(_s(cfg, "state_on", on), _s(cfg, "state_off", off))
    ctpl = _template(cfg, "command_template", {"value": "ON"})
    out.acts.append(_Act(
        _slug(comp.object_id), comp, "state", _name(comp), "bool", "set_state", cmd,
        _bool_encoder(ctpl, on, off), [(state, c.matcher(tpl, table))], "true: on; false: off"))


def _bool_encoder(template: str | None, on: str | None, off: str | None) -> Callable[[Value], str]:
    def encode(value: Value) -> str:
        payload = (on if value else off) or ""
        return c.render(template, {"value": payload}) if template else payload
    return encode


def _lock(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    cmd, state = _command_and_state(comp, "state")
    lock, unlock = _s(cfg, "payload_lock", "LOCK"), _s(cfg, "payload_unlock", "UNLOCK")
    tpl = _template(cfg, "value_template")
    table = _bool_table(_s(cfg, "state_locked", "LOCKED"), _s(cfg, "state_unlocked", "UNLOCKED"))
    ctpl = _template(cfg, "command_template", {"value": "LOCK"})
    if cfg.get("payload_open") is not None:
        out.leave(comp, "open", "opening the door (payload_open) is a momentary action, not a state the lock "
                  "reports; only lock and unlock are mapped")
    out.acts.append(_Act(
        _slug(comp.object_id), comp, "state", _name(comp), "bool", "set_state", cmd,
        _bool_encoder(ctpl, lock, unlock), [(state, c.matcher(tpl, table))],
        "true: locked; false: unlocked (states such as jammed or locking are not values)"))


def _valve(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    if cfg.get("reports_position"):
        _valve_position(comp, out)
        return
    cmd, state = _command_and_state(comp, "state")
    opened, closed = _s(cfg, "payload_open", "OPEN"), _s(cfg, "payload_close", "CLOSE")
    tpl = _template(cfg, "value_template")
    table = _bool_table(_s(cfg, "state_open", "open"), _s(cfg, "state_closed", "closed"))
    ctpl = _template(cfg, "command_template", {"value": "OPEN"})
    out.acts.append(_Act(
        _slug(comp.object_id), comp, "state", _name(comp), "bool", "set_state", cmd,
        _bool_encoder(ctpl, opened, closed), [(state, c.matcher(tpl, table))],
        "true: open; false: closed (opening and closing are not values)"))


def _percent_scale(cfg: Mapping[str, Any]) -> tuple[Callable[[float], float], Callable[[float], float]]:
    """Percent open (0 closed, 100 open, what Corral shows) to the device's position_closed..position_open and
    back (on the contract's whole-percent step, as a native device reports its state)."""
    full, shut = _n(cfg, "position_open", 100), _n(cfg, "position_closed", 0)
    if full == shut:
        raise _Out("its position_open equals its position_closed")

    def to_device(percent: float) -> float:
        return round(shut + (full - shut) * percent / 100)

    def to_percent(device: float) -> float:
        return round(max(0.0, min(100.0, (device - shut) * 100 / (full - shut))))
    return to_device, to_percent


def _valve_position(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    cmd, state = _command_and_state(comp, "position")
    to_device, to_percent = _percent_scale(cfg)
    ctpl = _template(cfg, "command_template", {"value": 50})
    tpl = _template(cfg, "value_template")

    def encode(value: Value) -> str:
        device = c.tidy(to_device(float(value)))
        return c.render(ctpl, {"value": device}) if ctpl else c.payload_text(device)
    out.acts.append(_Act(
        _slug(comp.object_id), comp, "position", _name(comp), "number", "set_position", cmd, encode,
        [(state, c.number(tpl, to_percent))], "percent open: 0 closed, 100 open", range=(0, 100), step=1, unit="%"))


def _cover(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    base = _slug(comp.object_id)
    pos_cmd = _topic(cfg, "set_position_topic")
    if pos_cmd is not None and _topic(cfg, "position_topic") is None and _topic(cfg, "command_topic"):
        out.leave(comp, "position", "it reports no position (no position_topic), so a position could never be "
                  "confirmed; it maps as open/closed")
    elif pos_cmd is not None:
        pos_state = _needs_state(comp, _topic(cfg, "position_topic"), "position")
        to_device, to_percent = _percent_scale(cfg)

        ptpl = _template(cfg, "set_position_template", {"position": 50, "value": 50})
        tpl = _template(cfg, "position_template")

        def encode(value: Value) -> str:
            device = c.tidy(to_device(float(value)))
            return c.render(ptpl, {"position": device, "value": device}) if ptpl else c.payload_text(device)
        out.acts.append(_Act(
            base, comp, "position", _name(comp), "number", "set_position", pos_cmd, encode,
            [(pos_state, c.number(tpl, to_percent))], "percent open: 0 closed, 100 open", range=(0, 100), step=1,
            unit="%"))
        if _topic(cfg, "command_topic"):
            out.leave(comp, "open/close/stop", "the position covers open and closed; stop is not a target state")
        return
    cmd = _topic(cfg, "command_topic")
    if cmd is None:
        raise _Out("it has neither command_topic nor set_position_topic: nothing can be set")
    state = _needs_state(comp, _topic(cfg, "state_topic"), "state")
    opened, closed = _s(cfg, "payload_open", "OPEN"), _s(cfg, "payload_close", "CLOSE")
    if opened is None or closed is None:
        raise _Out("it declares no open or no close payload")
    tpl = _template(cfg, "value_template")
    table = _bool_table(_s(cfg, "state_open", "open"), _s(cfg, "state_closed", "closed"))
    out.acts.append(_Act(
        base, comp, "state", _name(comp), "bool", "set_state", cmd, _bool_encoder(None, opened, closed),
        [(state, c.matcher(tpl, table))], "true: open; false: closed (opening, closing and stopped are not values)"))


def _number(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    cmd, state = _command_and_state(comp, "value")
    low, high, step = _n(cfg, "min", 1), _n(cfg, "max", 100), _n(cfg, "step", 1)
    ctpl = _template(cfg, "command_template", {"value": low})
    tpl = _template(cfg, "value_template")
    unit = _unit(comp, out, "unit_of_measurement")
    out.acts.append(_Act(
        _slug(comp.object_id), comp, "value", _name(comp), "number", "set_value", cmd, _encode_template(ctpl),
        [(state, c.number(tpl))], "a number the device takes as it is", range=(low, high), step=step, unit=unit))


def _select(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    cmd, state = _command_and_state(comp, "option")
    values, to_device, from_device = _enum(comp, out, cfg.get("options"), "options")
    ctpl = _template(cfg, "command_template", {"value": "x"})
    tpl = _template(cfg, "value_template")
    out.acts.append(_Act(
        _slug(comp.object_id), comp, "option", _name(comp), "enum", "set_mode", cmd,
        _enum_encoder(ctpl, to_device), [(state, c.matcher(tpl, from_device))], "one of the device's options",
        values=values))


def _enum_encoder(template: str | None, to_device: Mapping[str, str]) -> Callable[[Value], str]:
    def encode(value: Value) -> str:
        payload = to_device[str(value)]
        return c.render(template, {"value": payload}) if template else payload
    return encode


def _fan(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    base = _slug(comp.object_id)
    cmd, state = _command_and_state(comp, "state")
    on, off = _s(cfg, "payload_on", "ON"), _s(cfg, "payload_off", "OFF")
    ctpl = _template(cfg, "command_template", {"value": "ON"})
    tpl = _template(cfg, "state_value_template")
    out.acts.append(_Act(base, comp, "state", _name(comp), "bool", "set_state", cmd, _bool_encoder(ctpl, on, off),
                         [(state, c.matcher(tpl, _bool_table(on, off)))], "true: on; false: off"))
    _part(comp, out, "preset_mode", lambda: _fan_preset(comp, out, base))
    _part(comp, out, "percentage", lambda: _fan_percentage(comp, out, base))
    for key, part in (("oscillation_command_topic", "oscillation"), ("direction_command_topic", "direction")):
        if cfg.get(key):
            out.leave(comp, part, f"{part} is not mapped (only on/off, preset mode and speed are)")


def _fan_preset(comp: Component, out: _Drafts, base: str) -> None:
    cfg = comp.config
    cmd = _topic(cfg, "preset_mode_command_topic")
    if cmd is None:
        return
    state = _needs_state(comp, _topic(cfg, "preset_mode_state_topic"), "preset mode")
    values, to_device, from_device = _enum(comp, out, cfg.get("preset_modes"), "preset_modes")
    ctpl = _template(cfg, "preset_mode_command_template", {"value": "x"})
    tpl = _template(cfg, "preset_mode_value_template")
    out.acts.append(_Act(f"{base}_preset_mode", comp, "preset_mode", _name(comp, "preset"), "enum", "set_mode",
                         cmd, _enum_encoder(ctpl, to_device), [(state, c.matcher(tpl, from_device))],
                         "the fan's preset mode", values=values))


def _fan_percentage(comp: Component, out: _Drafts, base: str) -> None:
    cfg = comp.config
    cmd = _topic(cfg, "percentage_command_topic")
    if cmd is None:
        return
    state = _needs_state(comp, _topic(cfg, "percentage_state_topic"), "speed")
    low, high = _n(cfg, "speed_range_min", 1), _n(cfg, "speed_range_max", 100)
    ctpl = _template(cfg, "percentage_command_template", {"value": low})
    tpl = _template(cfg, "percentage_value_template")
    if low > high or low < 0:
        raise _Out("its speed_range_min is above its speed_range_max, or below 0")
    # The device's own speed scale (speed_range_min..max; 1..100 by default is a percentage). Off is the fan's
    # state, not a speed: Home Assistant switches a fan off with payload_off, never with 0 on this topic.
    out.acts.append(_Act(f"{base}_speed", comp, "percentage", _name(comp, "speed"), "number", "set_value", cmd,
                         _encode_template(ctpl), [(state, c.number(tpl))],
                         "fan speed in the device's own steps (off is the fan's state)", range=(low, high), step=1,
                         unit="%" if (low, high) == (1, 100) else ""))


def _light(comp: Component, out: _Drafts) -> None:
    schema = comp.config.get("schema", "default")
    if schema in ("default", "basic", None):
        _light_default(comp, out)
    elif schema == "json":
        _light_json(comp, out)
    elif schema == "template":
        _light_template(comp, out)
    else:
        raise _Out(f"its schema {quoted_data(str(schema), _QUOTE)} is not one of default, json, template")
    if schema != "json":
        parts = {"colour" if "effect" not in key else "effect" for key in (
            "rgb_command_topic", "hs_command_topic", "xy_command_topic", "rgbw_command_topic", "rgbww_command_topic",
            "white_command_topic", "red_template", "effect_command_topic", "effect_list") if comp.config.get(key)}
        for part in sorted(parts):
            out.leave(comp, part, f"{'effects' if part == 'effect' else 'colours'} are not mapped (only on/off, "
                      "brightness and colour temperature of lights are)")


def _brightness_range(cfg: Mapping[str, Any]) -> float:
    scale = _n(cfg, "brightness_scale", 255)
    if scale < 1:
        raise _Out("its brightness_scale is below 1")
    return scale


def _ct(cfg: Mapping[str, Any]) -> tuple[float, float, str]:
    """The colour temperature range and unit: kelvin when the config says color_temp_kelvin, else mireds."""
    if cfg.get("color_temp_kelvin"):
        return _n(cfg, "min_kelvin", 2000), _n(cfg, "max_kelvin", 6535), "K"
    return _n(cfg, "min_mireds", 153), _n(cfg, "max_mireds", 500), "mired"


def _light_default(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    base = _slug(comp.object_id)
    cmd, state = _command_and_state(comp, "state")
    on, off = _s(cfg, "payload_on", "ON"), _s(cfg, "payload_off", "OFF")
    tpl = _template(cfg, "state_value_template")
    out.acts.append(_Act(base, comp, "state", _name(comp), "bool", "set_state", cmd, _bool_encoder(None, on, off),
                         [(state, c.matcher(tpl, _bool_table(on, off)))], "true: on; false: off"))

    def brightness() -> None:
        bcmd = _topic(cfg, "brightness_command_topic")
        if bcmd is None:
            return
        bstate = _needs_state(comp, _topic(cfg, "brightness_state_topic"), "brightness")
        scale = _brightness_range(cfg)
        ctpl = _template(cfg, "brightness_command_template", {"value": 1})
        btpl = _template(cfg, "brightness_value_template")
        out.acts.append(_Act(f"{base}_brightness", comp, "brightness", _name(comp, "brightness"), "number",
                             "set_value", bcmd, _encode_template(ctpl), [(bstate, c.number(btpl))],
                             f"brightness from 0 to {c.payload_text(scale)} (the device's scale)",
                             range=(0, scale), step=1))

    def color_temp() -> None:
        tcmd = _topic(cfg, "color_temp_command_topic")
        if tcmd is None:
            return
        tstate = _needs_state(comp, _topic(cfg, "color_temp_state_topic"), "colour temperature")
        low, high, unit = _ct(cfg)
        ctpl = _template(cfg, "color_temp_command_template", {"value": low})
        ttpl = _template(cfg, "color_temp_value_template")
        out.acts.append(_Act(f"{base}_color_temp", comp, "color_temp", _name(comp, "colour temperature"), "number",
                             "set_value", tcmd, _encode_template(ctpl), [(tstate, c.number(ttpl))],
                             f"colour temperature in {unit}", range=(low, high), step=1, unit=unit))
    _part(comp, out, "brightness", brightness)
    _part(comp, out, "color_temp", color_temp)


def _light_json(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    base = _slug(comp.object_id)
    cmd, state = _command_and_state(comp, "state")
    table = _bool_table("ON", "OFF")

    def state_of(value: object) -> Value | None:
        return table.get(value) if isinstance(value, str) else None

    def json_number(value: object) -> Value | None:
        number = c.as_number(value)
        return None if number is None else c.tidy(number)

    out.acts.append(_Act(base, comp, "state", _name(comp), "bool", "set_state", cmd,
                         lambda v: _json({"state": "ON" if v else "OFF"}), [(state, c.json_field("state", state_of))],
                         "true: on; false: off"))
    modes = cfg.get("supported_color_modes")
    modes = modes if isinstance(modes, list) else []
    if cfg.get("brightness") or any(m != "onoff" for m in modes):
        scale = _brightness_range(cfg)
        out.acts.append(_Act(f"{base}_brightness", comp, "brightness", _name(comp, "brightness"), "number",
                             "set_value", cmd, lambda v: _json({"state": "ON", "brightness": v}),
                             [(state, c.json_field("brightness", json_number))],
                             f"brightness from 0 to {c.payload_text(scale)} (the device's scale); setting it "
                             "switches the light on", range=(0, scale), step=1))
    colours = [str(m) for m in modes if m not in ("onoff", "brightness", "color_temp", "white")]
    if colours:
        out.leave(comp, "colour", f"colours (modes {quoted_data(', '.join(colours), _QUOTE)}) are not mapped (only "
                  "on/off, brightness and colour temperature of lights are)")
    if cfg.get("effect") or cfg.get("effect_list"):
        out.leave(comp, "effect", "effects are not mapped (only on/off, brightness and colour temperature of "
                  "lights are)")
    if "color_temp" in modes or cfg.get("color_temp"):
        low, high, unit = _ct(cfg)
        key = "color_temp"
        out.acts.append(_Act(f"{base}_color_temp", comp, "color_temp", _name(comp, "colour temperature"), "number",
                             "set_value", cmd, lambda v: _json({"state": "ON", key: v}),
                             [(state, c.json_field(key, json_number))],
                             f"colour temperature in {unit}; setting it switches the light on",
                             range=(low, high), step=1, unit=unit))


def _light_template(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    base = _slug(comp.object_id)
    cmd, state = _command_and_state(comp, "state")
    probe = {"state": "on", "brightness": 1, "color_temp": 153}
    on_tpl = _template(cfg, "command_on_template", probe, LIGHT_VARIABLES)
    off_tpl = _template(cfg, "command_off_template", {"state": "off"}, LIGHT_VARIABLES)
    if on_tpl is None or off_tpl is None:
        raise _Out("a template light needs command_on_template and command_off_template")
    state_tpl = _template(cfg, "state_template")
    if state_tpl is None:
        raise _Out("it has no state_template, so its state cannot be read")
    out.acts.append(_Act(base, comp, "state", _name(comp), "bool", "set_state", cmd,
                         lambda v: c.render(on_tpl if v else off_tpl, {"state": "on" if v else "off"},
                                            LIGHT_VARIABLES),
                         [(state, c.matcher(state_tpl, _bool_table("on", "off")))], "true: on; false: off"))
    compiled = c.command_template(on_tpl, LIGHT_VARIABLES)
    if compiled.required - {"state"}:
        raise _Out(f"its command_on_template needs {', '.join(sorted(compiled.required - {'state'}))} outside an "
                   "`is defined` section, so it cannot switch the light on by itself")
    uses = compiled.variables
    for var, key, capability, rng, unit in (("brightness", "brightness_template", "brightness", (0.0, 255.0), ""),
                                             ("color_temp", "color_temp_template", "color_temp", None, "mired")):
        if var not in uses:
            continue
        read_tpl = _template(cfg, key)
        if read_tpl is None:
            out.leave(comp, capability, f"it has no {key}, so a {capability} command could never be confirmed")
            continue
        low, high = rng if rng else _ct(cfg)[:2]
        out.acts.append(_Act(
            f"{base}_{capability}", comp, capability, _name(comp, capability.replace("_", " ")), "number",
            "set_value", cmd, _template_encoder(on_tpl, var), [(state, c.number(read_tpl))],
            f"{capability.replace('_', ' ')}; setting it switches the light on", range=(low, high), step=1,
            unit=unit))


def _template_encoder(template: str, var: str) -> Callable[[Value], str]:
    return lambda value: c.render(template, {"state": "on", var: value}, LIGHT_VARIABLES)


def _climate(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    base = _slug(comp.object_id)
    mapped = False
    tcmd = _topic(cfg, "temperature_command_topic")
    if tcmd is not None:
        tstate = _needs_state(comp, _topic(cfg, "temperature_state_topic"), "target temperature")
        unit = {"C": "°C", "F": "°F"}.get(str(cfg.get("temperature_unit") or "C"), "°C")
        defaults = (7.0, 35.0) if unit == "°C" else (44.6, 95.0)
        low, high = _n(cfg, "min_temp", defaults[0]), _n(cfg, "max_temp", defaults[1])
        step = _n(cfg, "temp_step", 1)
        ctpl = _template(cfg, "temperature_command_template", {"value": low})
        tpl = _template(cfg, "temperature_state_template")
        out.acts.append(_Act(f"{base}_target_temperature", comp, "target_temperature",
                             _name(comp, "target temperature"), "number", "set_value", tcmd, _encode_template(ctpl),
                             [(tstate, c.number(tpl))], "the temperature the device heats or cools to",
                             range=(low, high), step=step, unit=unit))
        mapped = True
    else:
        out.leave(comp, "target temperature", "it has no temperature_command_topic")

    def mode() -> None:
        mcmd = _topic(cfg, "mode_command_topic")
        if mcmd is None:
            return
        mstate = _needs_state(comp, _topic(cfg, "mode_state_topic"), "mode")
        modes = cfg.get("modes", ["auto", "off", "cool", "heat", "dry", "fan_only"])
        values, to_device, from_device = _enum(comp, out, modes, "modes")
        ctpl = _template(cfg, "mode_command_template", {"value": "off"})
        tpl = _template(cfg, "mode_state_template")
        out.acts.append(_Act(f"{base}_mode", comp, "mode", _name(comp, "mode"), "enum", "set_mode", mcmd,
                             _enum_encoder(ctpl, to_device), [(mstate, c.matcher(tpl, from_device))],
                             "the device's operating mode", values=values))
    _part(comp, out, "mode", mode)
    current = _topic(cfg, "current_temperature_topic")
    if current is not None:
        tpl = _template(cfg, "current_temperature_template")
        unit = {"C": "°C", "F": "°F"}.get(str(cfg.get("temperature_unit") or "C"), "°C")
        out.sens.append(_Sen(f"{base}_temperature", comp, _name(comp, "temperature"), [(current, c.number(tpl))],
                             unit=unit, description="the temperature the device measures"))
        mapped = True
    for key in ("fan_mode_command_topic", "swing_mode_command_topic", "preset_mode_command_topic",
                "target_humidity_command_topic", "temperature_high_command_topic", "temperature_low_command_topic",
                "power_command_topic"):
        if cfg.get(key):
            out.leave(comp, key.removesuffix("_command_topic"), "only a climate's target temperature and simple "
                      "mode are mapped")
    if not mapped:
        raise _Out("neither its target temperature nor its current temperature can be mapped")


def _binary_sensor(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    state = _topic(cfg, "state_topic")
    if state is None:
        raise _Out("it has no state_topic")
    tpl = _template(cfg, "value_template")
    table = _bool_table(_s(cfg, "payload_on", "ON"), _s(cfg, "payload_off", "OFF"))
    dc = cfg.get("device_class")
    what = f"{safe_text(dc)} (true: on/detected)" if isinstance(dc, str) and dc else "true: on; false: off"
    out.sens.append(_Sen(_slug(comp.object_id), comp, _name(comp), [(state, c.matcher(tpl, table))],
                         description=bounded(what, 200)))


_TEXT_CLASSES = frozenset({"timestamp", "date"})


def _sensor(comp: Component, out: _Drafts) -> None:
    cfg = comp.config
    state = _topic(cfg, "state_topic")
    if state is None:
        raise _Out("it has no state_topic")
    dc = cfg.get("device_class")
    tpl = _template(cfg, "value_template")
    unit = _unit(comp, out, "unit_of_measurement")
    if dc == "enum" or cfg.get("options"):
        values, _to, from_device = _enum(comp, out, cfg.get("options"), "options")
        out.sens.append(_Sen(_slug(comp.object_id), comp, _name(comp), [(state, c.matcher(tpl, from_device))],
                             description=bounded("one of " + ", ".join(values), 512)))
        return
    if dc in _TEXT_CLASSES:
        # Text readings are not telemetry: nothing could check what they say. Other sensors are read as numbers;
        # a reading that is not one is skipped.
        raise _Out(f"its readings are text (device_class {dc}), not measurements")
    rng: tuple[float, float] | None = None
    if c.as_number(cfg.get("min")) is not None and c.as_number(cfg.get("max")) is not None:
        rng = (_n(cfg, "min", 0), _n(cfg, "max", 0))
    desc = safe_text(dc) if isinstance(dc, str) else ""
    out.sens.append(_Sen(_slug(comp.object_id), comp, _name(comp), [(state, c.number(tpl))], unit=unit,
                         range=rng, description=bounded(desc, 200)))


_MAPPERS: dict[str, Callable[[Component, _Drafts], None]] = {
    "switch": _switch, "lock": _lock, "valve": _valve, "cover": _cover, "number": _number, "select": _select,
    "fan": _fan, "light": _light, "climate": _climate, "binary_sensor": _binary_sensor, "sensor": _sensor,
}


def _part(comp: Component, out: _Drafts, part: str, build: Callable[[], None]) -> None:
    """Map an optional part of a component; a part that does not map is left out on its own."""
    try:
        build()
    except _Out as err:
        out.leave(comp, part, str(err))


def _json(data: Mapping[str, object]) -> str:
    return json.dumps(data, separators=(",", ":"))


def _unit(comp: Component, out: _Drafts, key: str) -> str:
    raw = comp.config.get(key)
    if raw is None:
        return ""
    unit = safe_text(str(raw)) if isinstance(raw, (str, int, float)) else ""
    if len(unit) > 16:
        out.leave(comp, "unit", f"its {key} is longer than 16 characters: {quoted_data(unit, _QUOTE)}")
        return ""
    return unit


def _enum(comp: Component, out: _Drafts, options: object, key: str,
          ) -> tuple[list[str], dict[str, str], dict[str, Value]]:
    """Enum values fitting the contract's pattern, and the maps between them and the device's own strings."""
    if not isinstance(options, list) or not options:
        raise _Out(f"its {key} is not a non-empty list")
    if len(options) > MAX_ITEMS:
        raise _Out(f"its {key} has {len(options)} entries; a contract enum holds at most {MAX_ITEMS}")
    values: list[str] = []
    to_device: dict[str, str] = {}
    from_device: dict[str, Value] = {}
    for option in options:
        if not isinstance(option, str) or option in from_device:
            continue
        value = _enum_value(option, set(values))
        if value is None:
            out.leave(comp, f"{key} entry", f"{quoted_data(option, _QUOTE)} cannot be written as an enum value")
            continue
        values.append(value)
        to_device[value] = option
        from_device[option] = value
    if not values:
        raise _Out(f"none of its {key} can be written as an enum value")
    return values, to_device, from_device


def _enum_value(option: str, taken: set[str]) -> str | None:
    if _ENUM.fullmatch(option) and option not in taken:
        return option
    slug = re.sub(r"[^A-Za-z0-9._+-]+", "_", safe_text(option)).strip("_.+-")[:28]
    if not slug or not slug[0].isalnum():
        return None
    for n in range(1, 100):
        candidate = slug if n == 1 else f"{slug}_{n}"
        if candidate not in taken and _ENUM.fullmatch(candidate):
            return candidate
    return None


# ---- ids ---------------------------------------------------------------------------------------------------

def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    if not slug:
        return "x"
    if not slug[0].isalpha():
        slug = "x_" + slug
    return slug[:32].rstrip("_")


def _unique(wanted: str, taken: set[str]) -> str:
    wanted = _slug(wanted)
    if wanted not in taken:
        taken.add(wanted)
        return wanted
    for n in range(2, 10_000):
        candidate = f"{wanted[:32 - len(str(n)) - 1].rstrip('_')}_{n}"
        if candidate not in taken:
            taken.add(candidate)
            return candidate
    raise AssertionError("unreachable: fewer than 10,000 ids per device")


def make_device_id(source: str, identifier: str) -> str:
    """A stable DNS label for a bridged device: `z2m-<ieee>` for zigbee2mqtt's default base topic,
    `<kind>-<slug>-<hash8>` otherwise (the hash covers source and identifier, so two sources never collide)."""
    kind, _, node = source.partition(":")
    digest = hashlib.sha256(f"{source}\n{identifier}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", identifier.lower()).strip("-")
    if kind == "zigbee2mqtt":
        candidate = f"z2m-{slug}"
        if node == "zigbee2mqtt" and slug == identifier.lower() and len(candidate) <= 63:
            return candidate
        prefix = "z2m"
    else:
        prefix = "ha"
    slug = slug[:63 - len(prefix) - 10].strip("-")
    candidate = f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"
    assert _DEVICE_ID.fullmatch(candidate), candidate
    return candidate


def _fw(sw_version: str) -> str:
    version = sw_version.strip()
    return version if _SEMVER.fullmatch(version) else FALLBACK_FW


# ---- derive ------------------------------------------------------------------------------------------------

def _level(comp: Component) -> ActuatorLevel:
    return "config" if comp.config.get("entity_category") == "config" else "write"


def derive(discovered: Discovered, risk_overrides: Mapping[str, str] | None = None, *,
           device_id: str | None = None) -> Derived:
    """The contract, codec and topics of one discovered device, and what was left out (see the module).
    `device_id`: the id to use when the caller keeps its own (default: `device_id(source, identifier)`)."""
    drafts = _Drafts(left=list(discovered.left_out))
    for comp in sorted(discovered.components, key=lambda x: (x.component, x.object_id)):
        mapper = _MAPPERS.get(comp.component)
        if mapper is None:
            drafts.leave(comp, "", f"the {quoted_data(comp.component, 40)} component is not mapped: only "
                         "switch, light, fan, cover, lock, valve, number, select, climate, binary_sensor and sensor "
                         "are")
            continue
        before = (len(drafts.acts), len(drafts.sens))
        try:
            mapper(comp, drafts)
        except _Out as err:
            # A component maps entirely or not at all: drop the parts it already added.
            del drafts.acts[before[0]:]
            del drafts.sens[before[1]:]
            drafts.leave(comp, "", str(err))
    return _build(discovered, drafts, risk_overrides or {},
                  device_id or make_device_id(discovered.key.source, discovered.key.identifier))


def _build(discovered: Discovered, drafts: _Drafts, overrides: Mapping[str, str], the_id: str) -> Derived:
    left = drafts.left
    taken: set[str] = set()
    acts: list[tuple[str, _Act]] = [(_unique(a.wanted, taken), a) for a in drafts.acts]
    risks = {aid: risk_for(a.component.component, a.capability, a.component.config, a.component.object_id)
             for aid, a in acts}
    rules, unknown = apply_overrides(risks, overrides)
    actuators: dict[str, c.ActuatorCodec] = {}
    for aid, a in acts:
        if len(actuators) == MAX_ITEMS:
            left.append(LeftOut(_what(a.component, a.capability), f"a contract holds at most {MAX_ITEMS} actuators"))
            continue
        try:
            actuator = _actuator(aid, a, rules[aid])
        except ValidationError as err:
            left.append(LeftOut(_what(a.component, a.capability), _first_error(err)))
            continue
        actuators[aid] = c.ActuatorCodec(actuator, a.topic, a.encode,
                                         tuple(c.Reader(t, d) for t, d in a.readers), _qos(a.component.config))
    # Metrics are unique among the actuator ids too: one state message reads both, and a reader may merge them.
    sensors: dict[str, c.SensorCodec] = {}
    for s in drafts.sens:
        metric = _unique(s.wanted, taken)
        if len(sensors) == MAX_ITEMS:
            left.append(LeftOut(_what(s.component), f"a contract holds at most {MAX_ITEMS} sensors"))
            continue
        try:
            described = f"{s.name}: {s.description}" if s.description else s.name
            sensor = Sensor(metric=metric, unit=s.unit, description=bounded(described, 512),
                            range=Range(min=s.range[0], max=s.range[1]) if s.range else None,
                            interval_s=_interval(s.component.config))
        except ValidationError as err:
            left.append(LeftOut(_what(s.component), _first_error(err)))
            continue
        sensors[metric] = c.SensorCodec(sensor, tuple(c.Reader(t, d) for t, d in s.readers))
    info = discovered.device
    contract = Contract(
        device_id=the_id,
        name=bounded(info.name, 64) or bounded(info.model, 64) or "Bridged device",
        model=bounded(info.model, 64) or bounded(info.manufacturer, 64) or "unknown",
        fw=_fw(info.sw_version),
        sensors=[s.sensor for s in sensors.values()],
        actuators=[a.actuator for a in actuators.values()],
    )
    codec = c.DeviceCodec(actuators, sensors, _availability(discovered.components))
    topics = Topics(codec.command_topics(), codec.state_topics(), codec.availability_topics())
    # Reasons quote device text (templates, options, names): made safe here, whoever wrote the LeftOut.
    left_out = tuple(LeftOut(bounded(x.what, 200), bounded(x.reason, 512)) for x in left)
    return Derived(contract, codec, topics, left_out,
                   {aid: rules[aid].why for aid in actuators}, unknown)


def _interval(cfg: Mapping[str, Any]) -> float | None:
    """A sensor's interval from Home Assistant's `expire_after` (seconds after which its reading is no longer
    valid): a cited sample may be 2.5 intervals old (contract.freshness), so the interval is expire_after / 2.5.
    Without it, none (the cluster's default applies)."""
    expire = c.as_number(cfg.get("expire_after"))
    if expire is None or expire <= 0:
        return None
    return min(max(round(expire / 2.5, 3), SENSOR_MIN_INTERVAL_S), SENSOR_MAX_INTERVAL_S)


def _actuator(aid: str, a: _Act, rule: RiskRule) -> Actuator:
    return Actuator(
        id=aid, name=a.name or aid, type=a.type, action=a.action, risk=rule.risk, level=_level(a.component),
        values=a.values, range=Range(min=a.range[0], max=a.range[1]) if a.range else None,
        step=a.step if a.type == "number" else None, unit=a.unit,
        description=bounded(f"{a.description}. Bridged ({a.component.component}): no device-side clamp.", 512),
    )


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(x) for x in first.get("loc", ()))
    return bounded(f"it does not fit the contract: {where}: {first.get('msg', '')}", 300)


def _availability(components: Iterable[Component]) -> c.Availability:
    seen: dict[str, c.AvailabilityTopic] = {}
    mode = "latest"
    for comp in sorted(components, key=lambda x: (x.component, x.object_id)):
        cfg = comp.config
        entries: list[Mapping[str, Any]] = []
        if isinstance(cfg.get("availability"), list):
            entries += [e for e in cfg["availability"] if isinstance(e, Mapping)]
        if isinstance(cfg.get("availability_topic"), str):
            entries.append({"topic": cfg["availability_topic"], "payload_available": cfg.get("payload_available"),
                            "payload_not_available": cfg.get("payload_not_available"),
                            "value_template": cfg.get("availability_template")})
        if cfg.get("availability_mode") in ("all", "any", "latest"):
            mode = str(cfg["availability_mode"])
        for entry in entries:
            try:
                topic = _topic(entry, "topic")
                tpl = _template(entry, "value_template")
            except _Out:
                continue
            if topic is None or topic in seen:
                continue
            seen[topic] = c.AvailabilityTopic(
                topic, str(entry.get("payload_available") or "online"),
                str(entry.get("payload_not_available") or "offline"), tpl)
    return c.Availability(tuple(seen.values()), mode)
