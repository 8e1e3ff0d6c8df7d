"""zigbee2mqtt's retained `<base>/bridge/devices` message, read into `Discovered` devices. Pure.

Each device's typed exposes become `Component`s in the shape zigbee2mqtt's own Home Assistant extension announces
them (lib/extension/homeassistant.ts in github:Koenkk/zigbee2mqtt, `exposeToConfig` and `discover`), with the topics
filled in as that extension fills them, so that the mapping and the codec read zigbee2mqtt devices exactly like
Home Assistant discovery ones:

- `light` composite -> light, schema json, on `<base>/<friendly>/set` and `<base>/<friendly>`;
- `switch` composite -> switch (`value_template` on the state property, payload_on/off = value_on/off);
- `lock` -> lock; `climate` -> climate (target temperature from occupied_heating_setpoint or
  current_heating_setpoint, else occupied_cooling_setpoint; system_mode -> modes); `cover` -> cover (position);
  `fan` -> fan;
- `binary` -> switch if it can be set, else binary_sensor; `numeric` -> number if it can be set (min/max/step),
  else sensor (unit); `enum` -> select if it can be set, else sensor.

Where this module is stricter than zigbee2mqtt's extension (it is the allow-list's first step, not a UI):

- The access bits decide, feature by feature: an expose (or a light's brightness/colour temperature, a climate's
  setpoint) that cannot be set is never an actuator, and one that can be set but is never published in the state
  (write-only: `access` without the STATE bit, e.g. `effect`, `identify`) is left out, since no command to it
  could ever be confirmed by a state message.
- Composites other than the typed ones (`color_options`, `level_config`, `pin_code`), lists, settable texts,
  single-value enums (zigbee2mqtt's buttons) and an `action` enum are left out, named.
- Device-supplied names that end up in topics or templates (friendly names, endpoint names, properties) must be
  plain: a property is spliced into `value_json["<property>"]`, so anything but letters, digits, `_` and `-` leaves
  the expose out; a friendly name with MQTT wildcards, control characters, empty levels, or a `set`/`get`/
  `availability` level (which would make its state topic another device's command topic) leaves the device out.
- Home Assistant's cosmetic keys (icons, the long device-class lookups) are not reproduced; `entity_category` (from
  the expose's category), `unit_of_measurement` and a few measurement device classes are.

Availability: zigbee2mqtt's extension lists `<base>/bridge/state` and, when availability is enabled for the
device, `<base>/<friendly>/availability` (both JSON `{"state": "online"|"offline"}`, mode `all`). Whether it is
enabled is not in `bridge/devices`, so both are always listed; a device whose availability topic never arrives
is judged by the bridge state alone (the bridge's concern, not this module's).

Sizes are bounded (payload, devices, exposes, features, enum values, string lengths); anything out of bounds or of
the wrong type is left out with a reason, never raised, except a payload that is not a JSON list at all
(`UnreadableDevices`), which the caller must not take for "no devices".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from corral.bridge.model import Component, DeviceInfo, DeviceKey, Discovered, LeftOut

ACCESS_STATE = 0b001  # published in the device's state message
ACCESS_SET = 0b010  # can be set with `<friendly>/set`
ACCESS_GET = 0b100  # can be read on request (`<friendly>/get`); not used here

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024  # zigbee2mqtt networks reach a few hundred devices of ~20 kB each
MAX_DEVICES = 1000
MAX_EXPOSES = 200  # per device (the Danfoss Ally TRV has 33)
MAX_FEATURES = 32  # per composite
MAX_ENUM_VALUES = 128
MAX_STRING = 256  # names, labels, units, enum values: longer ones are cut (the mapping sanitizes and caps again)
MAX_NAME = 128  # friendly names and base topics, which become topic levels
MAX_NUMBER = 1e15  # bounds, steps and values beyond this are not a device's

_PROPERTY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_IEEE = re.compile(r"^0x[0-9a-fA-F]{16}$")
_RESERVED_LEVELS = frozenset({"set", "get", "availability"})

# Device classes for read-only numerics, by expose name (a subset of the extension's NUMERIC_DISCOVERY_LOOKUP: the
# measurements a reading is plotted by; icons and the rest are cosmetic).
_SENSOR_CLASSES: Mapping[str, str] = {
    "battery": "battery", "temperature": "temperature", "local_temperature": "temperature",
    "device_temperature": "temperature", "humidity": "humidity", "pressure": "pressure", "power": "power",
    "voltage": "voltage", "current": "current", "energy": "energy", "illuminance": "illuminance", "co2": "carbon_dioxide",
    "pm25": "pm25", "soil_moisture": "moisture",
}
_BINARY_CLASSES: Mapping[str, str] = {
    "contact": "door", "occupancy": "occupancy", "presence": "occupancy", "water_leak": "moisture", "smoke": "smoke",
    "gas": "gas", "carbon_monoxide": "carbon_monoxide", "tamper": "tamper", "vibration": "vibration",
    "battery_low": "battery", "window": "window", "window_open": "window", "garage_door_contact": "garage_door",
}
# Settable binaries zigbee2mqtt announces as configuration switches on their own set topic (CONFIG_SWITCH_...).
_SWITCH_DIFFERENT = frozenset({"auto_lock", "away_mode", "comfort_smiley", "enable_display", "indicator", "tilt_mode",
                               "valve_detection", "window_detection"})


class UnreadableDevices(ValueError):
    """The payload as a whole is not a zigbee2mqtt device list (not JSON, not a list, too large)."""


def read_devices(payload: bytes, base_topic: str = "zigbee2mqtt") -> list[Discovered]:
    """The devices in a retained `<base_topic>/bridge/devices` payload, each with its components and what was left
    out. The coordinator is skipped; an unsupported, disabled or not yet interviewed device is a `Discovered` with no
    components and the reason. An empty payload (the retained message cleared) is no devices."""
    if not valid_topic_name(base_topic):
        raise ValueError(f"not a usable zigbee2mqtt base topic: {base_topic[:MAX_NAME]!r}")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise UnreadableDevices(f"bridge/devices is {len(payload)} bytes, more than {MAX_PAYLOAD_BYTES}")
    if not payload.strip():
        return []
    try:
        data = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UnreadableDevices(f"bridge/devices is not JSON: {str(e)[:200]}") from None
    if not isinstance(data, list):
        raise UnreadableDevices("bridge/devices is not a list")
    source = f"zigbee2mqtt:{base_topic}"
    found: list[Discovered] = []
    seen_ieee: set[str] = set()
    names: list[str] = []
    for entry in data[:MAX_DEVICES]:
        if not isinstance(entry, dict) or entry.get("type") == "Coordinator":
            continue
        ieee = entry.get("ieee_address")
        if not isinstance(ieee, str) or not _IEEE.match(ieee):
            continue  # nothing to key it by
        ieee = ieee.lower()
        if ieee in seen_ieee:
            continue
        seen_ieee.add(ieee)
        device = _read_device(entry, DeviceKey(source, ieee), base_topic, names)
        found.append(device)
    return found


def valid_topic_name(name: object) -> bool:
    """A friendly name or base topic that can stand in a topic: no wildcards, control characters, empty levels or
    reserved levels."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        return False
    if any(c in "+#" or ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        return False
    levels = name.split("/")
    return all(levels) and not _RESERVED_LEVELS.intersection(levels)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _text(value: object) -> str:
    return value[:MAX_STRING] if isinstance(value, str) else ""


def _read_device(entry: dict[str, Any], key: DeviceKey, base: str, names: list[str]) -> Discovered:
    definition = entry.get("definition")
    definition = definition if isinstance(definition, dict) else {}
    friendly = entry.get("friendly_name")
    info = DeviceInfo(name=_text(friendly), manufacturer=_text(definition.get("vendor")),
                      model=_text(definition.get("model")), sw_version=_text(entry.get("software_build_id")))

    def out(reason: str) -> Discovered:
        return Discovered(key, info, (), (LeftOut("device", reason),))

    if not valid_topic_name(friendly):
        return out("its friendly name cannot stand in an MQTT topic (wildcards, control characters, empty "
                   "levels, or a set/get/availability level)")
    assert isinstance(friendly, str)
    if friendly == "bridge" or friendly.startswith("bridge/"):
        return out("its friendly name is zigbee2mqtt's own bridge topic")
    clash = next((n for n in names if friendly == n or friendly.startswith(n + "/") or n.startswith(friendly + "/")),
                 None)
    if clash is not None:
        return out(f"its friendly name overlaps another device's topics ({clash[:MAX_STRING]!r})")
    names.append(friendly)
    if entry.get("supported") is not True or not definition:
        return out("zigbee2mqtt does not support it (no definition of its own)")
    if entry.get("disabled") is True:
        return out("it is disabled in zigbee2mqtt")
    interviewed = entry.get("interview_state") == "SUCCESSFUL" if "interview_state" in entry \
        else entry.get("interview_completed") is True
    if not interviewed:
        return out("zigbee2mqtt has not finished interviewing it")
    exposes = definition.get("exposes")
    if not isinstance(exposes, list):
        return out("its definition has no list of exposes")
    reader = _Reader(key, info, base, friendly, exposes[:MAX_EXPOSES])
    if len(exposes) > MAX_EXPOSES:
        reader.leave(f"exposes after the first {MAX_EXPOSES}", f"the device has {len(exposes)} exposes")
    reader.read()
    return Discovered(key, info, tuple(reader.components), tuple(reader.left_out))


def _number(value: object) -> float | int | None:
    """A finite number of a size a device range can have (a 400-digit integer would overflow float())."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if abs(value) <= MAX_NUMBER else None


def _js_string(value: object) -> str:
    """A value as zigbee2mqtt's `.toString()` writes it (true, 1, 1.5)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _ha_string(value: object) -> str:
    """A value as Home Assistant's config validation (cv.string) reads it (True, 1)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _state(prop: str) -> str:
    return f'{{{{ value_json["{prop}"] }}}}'


class _Reader:
    """One device's exposes -> components, as zigbee2mqtt's Home Assistant extension builds them."""

    def __init__(self, key: DeviceKey, info: DeviceInfo, base: str, friendly: str, exposes: list[Any]) -> None:
        self.key, self.info, self.base, self.friendly, self.exposes = key, info, base, friendly, exposes
        self.components: list[Component] = []
        self.left_out: list[LeftOut] = []
        self.device_topic = f"{base}/{friendly}"

    def leave(self, what: str, reason: str) -> None:
        self.left_out.append(LeftOut(what[:MAX_STRING], reason))

    # -- topics, as `discover` fills them --------------------------------------------------------------------------

    def command_topic(self, endpoint: str | None, postfix: str | None = None) -> str:
        prefix = f"{endpoint}/" if endpoint else ""
        return f"{self.device_topic}/{prefix}set" + (f"/{postfix}" if postfix else "")

    def availability(self) -> dict[str, Any]:
        return {
            "availability": [
                {"topic": f"{self.base}/bridge/state", "value_template": "{{ value_json.state }}",
                 "payload_available": "online", "payload_not_available": "offline"},
                {"topic": f"{self.device_topic}/availability", "value_template": "{{ value_json.state }}",
                 "payload_available": "online", "payload_not_available": "offline"},
            ],
            "availability_mode": "all",
        }

    def add(self, component: str, object_id: str, config: dict[str, Any], category: object = None) -> None:
        if any(c.object_id == object_id for c in self.components):
            self.leave(f"{component}.{object_id}", "another expose of the device has the same name")
            return
        if category in ("config", "diagnostic"):
            config["entity_category"] = category
            if component in ("sensor", "binary_sensor") and category == "config":
                config["entity_category"] = "diagnostic"  # sensors have no input (as the extension does)
        config.update(self.availability())
        self.components.append(Component(self.key, component, object_id, config, self.info,
                                          f"{self.base}/bridge/devices"))

    # -- reading -----------------------------------------------------------------------------------------------------

    def read(self) -> None:
        all_exposes = [e for e in self.exposes if isinstance(e, dict)]
        for index, expose in enumerate(self.exposes):
            if not isinstance(expose, dict):
                self.leave(f"expose {index}", "it is not an object")
                continue
            kind = expose.get("type")
            what = _describe(expose, index)
            endpoint = expose.get("endpoint")
            if endpoint is not None and not (isinstance(endpoint, str) and _PROPERTY.match(endpoint)):
                self.leave(what, "its endpoint name is not a plain name (letters, digits, _ and -)")
                continue
            try:
                reader = _READERS.get(kind) if isinstance(kind, str) else None
                if reader is None:
                    self.leave(what, f"zigbee2mqtt expose type {_text(kind)[:40]!r} is not mapped")
                    continue
                reader(self, expose, endpoint, all_exposes, what)
            except _Skip as skip:
                self.leave(what, str(skip))

    def light(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        features = _features(expose)
        state = _binary(_feature(features, "state"))
        _actuator(state, "its state")
        brightness = _numeric(_feature(features, "brightness"), need_range=True)
        color_temp = _numeric(_feature(features, "color_temp"), need_range=True)
        config: dict[str, Any] = {
            "name": endpoint.capitalize() if endpoint else None,
            "schema": "json",
            "command_topic": self.command_topic(endpoint),
            "state_topic": f"{self.device_topic}/{endpoint}" if endpoint else self.device_topic,
            "brightness": False,
        }
        if brightness is not None and _usable(brightness, self, f"{what} (brightness)"):
            config["brightness"] = True
            # The extension always says 254 (ZCL's level range); the expose's own maximum is the same for every
            # real light and is the device's word here.
            top = brightness.get("value_max")
            config["brightness_scale"] = int(top) if isinstance(top, (int, float)) and top >= 1 else 254
        modes: list[str] = []
        names = [f.get("name") for f in features]
        has_xy, has_hs = "color_xy" in names, "color_hs" in names
        prefer_hs = has_xy and has_hs and names.index("color_hs") < names.index("color_xy")
        if has_xy and not prefer_hs:
            modes.append("xy")
        elif has_hs:
            modes.append("hs")
        if color_temp is not None and _usable(color_temp, self, f"{what} (color_temp)"):
            modes.append("color_temp")
            config["min_mireds"] = color_temp["value_min"]
            config["max_mireds"] = color_temp["value_max"]
        config["supported_color_modes"] = modes or ["brightness"]
        for name in names:
            if isinstance(name, str) and name not in ("state", "brightness", "color_temp", "color_xy", "color_hs"):
                self.leave(f"{what} ({name[:64]})", "only a light's state, brightness and colour are mapped")
        effect = next((e for e in all_exposes if e.get("type") == "enum" and e.get("name") == "effect"), None)
        if effect is not None:
            values = _enum_values(effect)
            if values and _access(effect) & ACCESS_STATE and _access(effect) & ACCESS_SET:
                config["effect"] = True
                config["effect_list"] = values
        self.add("light", f"light_{endpoint}" if endpoint else "light", config, expose.get("category"))

    def switch(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        state = _binary(next((f for f in _features(expose) if f.get("type") == "binary" and f.get("name") == "state"),
                             None))
        _actuator(state, "its state")
        prop = state["property"]
        config: dict[str, Any] = {
            "name": endpoint.capitalize() if endpoint else None,
            "command_topic": self.command_topic(endpoint),
            "state_topic": self.device_topic,
            "value_template": _state(prop),
            "payload_on": _js_string(state["value_on"]),
            "payload_off": _js_string(state["value_off"]),
        }
        object_id = f"switch_{endpoint}" if endpoint else "switch"
        if prop in _SWITCH_DIFFERENT:
            config["name"] = _text(expose.get("label")) or None
            config["command_topic"] = self.command_topic(endpoint, prop)
            config["state_on"] = _js_string(state["value_on"])
            config["state_off"] = _js_string(state["value_off"])
            config["entity_category"] = "config"
            object_id = prop
        self.add("switch", object_id, config, expose.get("category"))

    def lock(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        state = _binary(next((f for f in _features(expose) if f.get("type") == "binary" and f.get("name") == "state"),
                             None))
        _actuator(state, "its state")
        prop = state["property"]
        config: dict[str, Any] = {
            "name": endpoint.capitalize() if endpoint else None,
            "command_topic": self.command_topic(endpoint, prop if endpoint else None),
            "state_topic": self.device_topic,
            "value_template": _state(prop),
            "state_locked": _js_string(state["value_on"]),
            "state_unlocked": _js_string(state["value_off"]),
            # Home Assistant's defaults, which the extension leaves implied; zigbee2mqtt reads a bare LOCK/UNLOCK on
            # the set topic as {"state": ...}.
            "payload_lock": "LOCK",
            "payload_unlock": "UNLOCK",
        }
        self.add("lock", f"lock_{endpoint}" if endpoint else "lock", config, expose.get("category"))

    def climate(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        features = _features(expose)
        numerics = [f for f in features if f.get("type") == "numeric"]
        heating = next((f for f in numerics if f.get("name") in ("occupied_heating_setpoint",
                                                                  "current_heating_setpoint")), None)
        cooling = next((f for f in numerics if f.get("name") == "occupied_cooling_setpoint"), None)
        setpoint = _numeric(heating if heating is not None else cooling, need_range=True)
        if setpoint is None:
            raise _Skip("it has no target temperature with a minimum and a maximum")
        _actuator(setpoint, "its target temperature")
        temperature = _numeric(_feature(features, "local_temperature"))
        if temperature is None:
            raise _Skip("it has no local_temperature")
        config: dict[str, Any] = {
            "name": endpoint.capitalize() if endpoint else None,
            "temperature_unit": "C",
            "min_temp": float(setpoint["value_min"]),
            "max_temp": float(setpoint["value_max"]),
            "current_temperature_topic": self.device_topic,
            "current_temperature_template": _state(temperature["property"]),
            "temperature_command_topic": self.command_topic(endpoint, setpoint["name"]),
            "temperature_state_topic": self.device_topic,
            "temperature_state_template": _state(setpoint["property"]),
        }
        step = _number(setpoint.get("value_step"))
        if step is not None and step > 0:
            config["temp_step"] = step
        if heating is not None and cooling is not None:
            self.leave(f"{what} (occupied_cooling_setpoint)", "a heating and cooling range (two setpoints) is not "
                       "mapped; the heating setpoint is the target temperature")
        mode = _enum(_feature(features, "system_mode"))
        if mode is not None and _access(mode) & ACCESS_SET and _access(mode) & ACCESS_STATE:
            values = [v for v in _enum_values(mode) if v != "sleep"]  # Home Assistant has no sleep mode
            config.update({"mode_state_topic": self.device_topic, "mode_state_template": _state(mode["property"]),
                           "modes": values, "mode_command_topic": self.command_topic(endpoint, "system_mode")})
        for name in ("fan_mode", "swing_mode", "preset"):
            if _feature(features, name) is not None:
                self.leave(f"{what} ({name})", "only a climate's target temperature and mode are mapped")
        self.add("climate", f"climate_{endpoint}" if endpoint else "climate", config, expose.get("category"))
        # The extension announces these features of a climate as entities of their own.
        has_sensor = any(e.get("type") == "numeric" and e.get("name") in ("temperature", "local_temperature")
                         and _access(e) & ACCESS_STATE for e in all_exposes)
        extras: list[tuple[str, str | None]] = [("local_temperature_calibration", "config"),
                                                ("pi_heating_demand", "diagnostic")]
        if not has_sensor:
            extras.append(("local_temperature", None))
        for name, category in extras:
            feature = _feature(features, name)
            if feature is None:
                continue
            try:
                self.numeric(feature, endpoint, all_exposes, f"{what} ({name})", category=category)
            except _Skip as skip:
                self.leave(f"{what} ({name})", str(skip))

    def cover(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        features = _features(expose)
        state = _feature(features, "state")
        if state is None or not isinstance(state.get("property"), str) or not _PROPERTY.match(state["property"]):
            raise _Skip("it has no state")
        if not _access(state) & ACCESS_SET:
            raise _Skip("its state cannot be set (access bits)")
        position = _numeric(_feature(features, "position"))
        prop = state["property"]
        config: dict[str, Any] = {
            "name": endpoint.capitalize() if endpoint else None,
            "command_topic": self.command_topic(endpoint),
            "state_topic": f"{self.device_topic}/{endpoint}" if endpoint else self.device_topic,
            "value_template": _state(_without_endpoint(prop, endpoint)),
            "state_open": "OPEN", "state_closed": "CLOSE", "state_stopped": "STOP",
            "payload_open": "OPEN", "payload_close": "CLOSE", "payload_stop": "STOP",
        }
        if position is not None and _usable(position, self, f"{what} (position)"):
            pprop = position["property"]
            config.update({
                "position_topic": config["state_topic"],
                "position_template": _state(_without_endpoint(pprop, endpoint)),
                "set_position_topic": self.command_topic(endpoint),
                "set_position_template": f'{{ "{pprop}": {{{{ position }}}} }}',
                "position_open": 100, "position_closed": 0,
            })
        else:
            config["optimistic"] = True
        if _feature(features, "tilt") is not None:
            self.leave(f"{what} (tilt)", "a cover's tilt is not mapped")
        self.add("cover", f"cover_{endpoint}" if endpoint else "cover", config, expose.get("category"))

    def fan(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        if endpoint:
            raise _Skip("a fan on an endpoint is not supported by zigbee2mqtt's Home Assistant extension")
        features = _features(expose)
        state = _binary(_feature(features, "state"))
        _actuator(state, "its state")
        config: dict[str, Any] = {
            "name": None,
            "state_topic": self.device_topic,
            "command_topic": self.command_topic(None, "fan_state"),
            "state_value_template": "{{ value_json.fan_state }}",
            "payload_on": "ON", "payload_off": "OFF",
        }
        mode = _enum(_feature(features, "mode"))
        speed = _numeric(_feature(features, "speed"), need_range=True)
        if mode is not None and _access(mode) & ACCESS_SET and _access(mode) & ACCESS_STATE:
            values = _enum_values(mode)
            presets = [v for v in values if v in ("on", "auto", "smart")]
            if presets:
                config.update({"preset_mode_state_topic": self.device_topic,
                               "preset_mode_command_topic": self.command_topic(None, "fan_mode"),
                               "preset_mode_value_template": _state(mode["property"]),
                               "preset_modes": presets})
            self.leave(f"{what} (speed)", "zigbee2mqtt's mode-emulated fan speed (a percentage template over the "
                       "fan modes) is not mapped; the modes are the fan's presets")
        elif speed is not None and _usable(speed, self, f"{what} (speed)"):
            config.update({"state_value_template": _state(state["property"]),
                           "command_topic": self.command_topic(None, "state"),
                           "percentage_state_topic": self.device_topic,
                           "percentage_command_topic": self.command_topic(None, "speed"),
                           "percentage_value_template": _state(speed["property"]),
                           "speed_range_min": speed["value_min"], "speed_range_max": speed["value_max"]})
        else:
            raise _Skip("a fan needs a settable mode or speed (zigbee2mqtt's extension refuses it otherwise)")
        self.add("fan", "fan", config, expose.get("category"))

    def binary(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        checked = _binary(expose)
        access = _access(checked)
        if not access & ACCESS_STATE:
            raise _Skip(_WRITE_ONLY if access & ACCESS_SET else "it is neither published nor settable")
        name, prop, label = checked["name"], checked["property"], _text(checked.get("label"))
        if access & ACCESS_SET:
            on, off = checked["value_on"], checked["value_off"]
            config: dict[str, Any] = {
                "name": f"{label} {endpoint}" if endpoint else label,
                "state_topic": self.device_topic,
                # zigbee2mqtt's extension writes `{% if value_json["p"] %}true{% else %}false{% endif %}` for a
                # boolean; `| lower` renders true/false the same (Jinja prints True as "True") and stays within
                # the bridge's template subset (templates.py), which has no if-expressions.
                "value_template": f'{{{{ value_json["{prop}"] | lower }}}}' if isinstance(on, bool) else _state(prop),
                "payload_on": _js_string(on), "payload_off": _js_string(off),
                "command_topic": self.command_topic(endpoint, prop),
            }
            self.add("switch", f"switch_{name}_{endpoint}" if endpoint else f"switch_{name}", config,
                     expose.get("category"))
            return
        config = {
            "name": f"{label} {endpoint}" if endpoint else label,
            "state_topic": self.device_topic,
            "value_template": _state(prop),
            "payload_on": _ha_string(checked["value_on"]), "payload_off": _ha_string(checked["value_off"]),
        }
        if name in _BINARY_CLASSES:
            config["device_class"] = _BINARY_CLASSES[name]
        self.add("binary_sensor", f"{name}_{endpoint}" if endpoint else name, config, expose.get("category"))

    def numeric(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str,
                category: object = None) -> None:
        checked = _numeric(expose)
        if checked is None:
            raise _Skip("it is not a valid numeric expose")
        access = _access(checked)
        if not access & ACCESS_STATE:
            raise _Skip(_WRITE_ONLY if access & ACCESS_SET else "it is neither published nor settable")
        name, prop, label = checked["name"], checked["property"], _text(checked.get("label"))
        unit = _text(checked.get("unit"))
        config: dict[str, Any] = {
            "name": f"{label} {endpoint}" if endpoint else label,
            "state_topic": self.device_topic,
            "value_template": _state(prop),
        }
        if unit:
            config["unit_of_measurement"] = unit
        object_id = f"{name}_{endpoint}" if endpoint else name
        ranged = checked.get("value_min") is not None and checked.get("value_max") is not None
        if access & ACCESS_SET and not ranged:
            # Home Assistant would read a number without bounds as 1..100; zigbee2mqtt gives none. The allow-list
            # takes ranges from the device, so without one only the reading is kept.
            self.leave(f"{what} (setting it)", "it can be set but has no value_min and value_max; only its "
                       "reading is kept")
        if access & ACCESS_SET and ranged:
            config["command_topic"] = self.command_topic(endpoint, prop)
            for source, target in (("value_min", "min"), ("value_max", "max"), ("value_step", "step")):
                if checked.get(source) is not None:
                    config[target] = checked[source]
            self.add("number", object_id, config, category or checked.get("category"))
            return
        if unit and name in _SENSOR_CLASSES:
            config["device_class"] = _SENSOR_CLASSES[name]
            config["state_class"] = "total_increasing" if name == "energy" else "measurement"
        self.add("sensor", object_id, config, category or checked.get("category"))

    def enum(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        checked = _enum(expose)
        if checked is None:
            raise _Skip("it is not a valid enum expose")
        access = _access(checked)
        prop, label = checked["property"], _text(checked.get("label"))
        if prop == "action":
            raise _Skip("device actions (button presses) are events, not state; they are not mapped")
        if not access & ACCESS_STATE:
            raise _Skip(_WRITE_ONLY if access & ACCESS_SET else "it is neither published nor settable")
        values = _enum_values(checked)
        if access & ACCESS_SET:
            if len(values) < 2:
                raise _Skip("a one-value enum is a button in zigbee2mqtt; buttons are not mapped")
            config: dict[str, Any] = {
                "name": f"{label} {endpoint}" if endpoint else label,
                "state_topic": self.device_topic,
                "value_template": _state(prop),
                "command_topic": self.command_topic(endpoint, prop),
                "options": values,
            }
            self.add("select", prop, config, checked.get("category"))
            return
        config = {"name": f"{label} {endpoint}" if endpoint else label, "state_topic": self.device_topic,
                  "value_template": _state(prop)}
        self.add("sensor", prop, config, checked.get("category"))

    def text(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        prop = expose.get("property")
        if not isinstance(prop, str) or not _PROPERTY.match(prop):
            raise _Skip("its property is not a plain name (letters, digits, _ and -)")
        if _access(expose) & ACCESS_SET:
            raise _Skip("settable text is not mapped")
        if not _access(expose) & ACCESS_STATE:
            raise _Skip("it is not published")
        label = _text(expose.get("label"))
        config = {"name": f"{label} {endpoint}" if endpoint else label, "state_topic": self.device_topic,
                  "value_template": _state(prop)}
        self.add("sensor", prop, config, expose.get("category"))

    def composite(self, expose: dict[str, Any], endpoint: str | None, all_exposes: list[Any], what: str) -> None:
        raise _Skip("a composite value (several features set together) is not mapped")


_WRITE_ONLY = "it can be set but zigbee2mqtt never publishes its state, so no command to it could be confirmed"


class _Skip(Exception):
    """This expose is left out; the message says why."""


def _describe(expose: dict[str, Any], index: int) -> str:
    kind = _text(expose.get("type"))[:32] or "expose"
    name = expose.get("property") or expose.get("name")
    endpoint = expose.get("endpoint")
    label = kind if not isinstance(name, str) else f"{kind} {name[:64]}"
    if isinstance(endpoint, str):
        label += f" (endpoint {endpoint[:32]})"
    return label if kind in _READERS or label != kind else f"{kind} #{index}"


def _features(expose: dict[str, Any]) -> list[dict[str, Any]]:
    features = expose.get("features")
    if not isinstance(features, list):
        raise _Skip("it has no list of features")
    if len(features) > MAX_FEATURES:
        raise _Skip(f"it has more than {MAX_FEATURES} features")
    return [f for f in features if isinstance(f, dict)]


def _feature(features: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((f for f in features if f.get("name") == name), None)


def _access(expose: Mapping[str, Any]) -> int:
    access = expose.get("access")
    return access & 0b111 if isinstance(access, int) and not isinstance(access, bool) and access >= 0 else 0


def _plain(expose: dict[str, Any]) -> bool:
    return all(isinstance(expose.get(k), str) and _PROPERTY.match(expose[k]) for k in ("name", "property"))


def _binary(expose: dict[str, Any] | None) -> dict[str, Any]:
    if expose is None:
        raise _Skip("it has no state")
    if expose.get("type") != "binary" or not _plain(expose):
        raise _Skip("its state is not a binary with a plain property name")
    for k in ("value_on", "value_off"):
        value = expose.get(k)
        if isinstance(value, str):
            if not 0 < len(value) <= 64:
                raise _Skip(f"its {k} is empty or too long")
        elif not isinstance(value, bool) and _number(value) is None:
            raise _Skip(f"its {k} is not a string, boolean or number")
    if expose.get("value_on") == expose.get("value_off"):
        raise _Skip("its value_on equals its value_off")
    return expose


def _actuator(expose: dict[str, Any], what: str) -> None:
    access = _access(expose)
    if not access & ACCESS_SET:
        raise _Skip(f"{what} cannot be set (access bits)")
    if not access & ACCESS_STATE:
        raise _Skip(f"{what}: {_WRITE_ONLY}")


def _numeric(expose: dict[str, Any] | None, need_range: bool = False) -> dict[str, Any] | None:
    """The expose if it is a well-formed numeric (finite bounds, min <= max, positive step), else None."""
    if expose is None or expose.get("type") != "numeric" or not _plain(expose):
        return None
    bounds = {k: expose.get(k) for k in ("value_min", "value_max", "value_step")}
    for v in bounds.values():
        if v is not None and _number(v) is None:
            return None
    low, high, step = bounds["value_min"], bounds["value_max"], bounds["value_step"]
    if low is not None and high is not None and low > high:
        return None
    if step is not None and step <= 0:
        return None
    if need_range and (low is None or high is None):
        return None
    return expose


def _usable(feature: dict[str, Any], reader: _Reader, what: str) -> bool:
    """A light's brightness or colour temperature, a cover's position: offered only if it can be set and is
    published; otherwise named as left out."""
    access = _access(feature)
    if access & ACCESS_SET and access & ACCESS_STATE:
        return True
    reader.leave(what, "it cannot be set (access bits)" if not access & ACCESS_SET else _WRITE_ONLY)
    return False


def _enum(expose: dict[str, Any] | None) -> dict[str, Any] | None:
    if expose is None or expose.get("type") != "enum" or not _plain(expose):
        return None
    values = expose.get("values")
    if not isinstance(values, list) or not values or len(values) > MAX_ENUM_VALUES:
        return None
    for v in values:
        if isinstance(v, str):
            if not 0 < len(v) <= 64:
                return None
        elif isinstance(v, bool) or _number(v) is None:
            return None
    return expose


def _enum_values(expose: dict[str, Any]) -> list[str]:
    checked = _enum(expose)
    if checked is None:
        return []
    out: list[str] = []
    for v in checked["values"]:
        text = _js_string(v)
        if text not in out:
            out.append(text)
    return out


def _without_endpoint(prop: str, endpoint: str | None) -> str:
    """zigbee2mqtt republishes an endpoint's state on `<friendly>/<endpoint>` without the `_<endpoint>` suffix."""
    suffix = f"_{endpoint}" if endpoint else ""
    return prop[: -len(suffix)] if suffix and prop.endswith(suffix) else prop


_READERS: Mapping[str, Any] = {
    "light": _Reader.light, "switch": _Reader.switch, "lock": _Reader.lock, "climate": _Reader.climate,
    "cover": _Reader.cover, "fan": _Reader.fan, "binary": _Reader.binary, "numeric": _Reader.numeric,
    "enum": _Reader.enum, "text": _Reader.text, "composite": _Reader.composite, "list": _Reader.composite,
}
