"""zigbee2mqtt's bridge/devices -> Components, on real definitions from the pinned zigbee-herdsman-converters
(made at test time by tools/z2m, tests/z2m_devices.py), plus hand-made and hostile input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.bridge.exposes import (
    MAX_DEVICES,
    MAX_PAYLOAD_BYTES,
    UnreadableDevices,
    read_devices,
    valid_topic_name,
)
from corral.bridge.model import COMPONENTS, Component, Discovered
from tests import z2m_devices

BASE = "zigbee2mqtt"


@pytest.fixture(scope="module")
def real() -> dict[str, Discovered]:
    found = read_devices(z2m_devices.bridge_devices())
    return {d.device.name: d for d in found}


def component(device: Discovered, kind: str, object_id: str | None = None) -> Component:
    matches = [c for c in device.components if c.component == kind and (object_id is None or c.object_id == object_id)]
    assert len(matches) == 1, [(c.component, c.object_id) for c in device.components]
    return matches[0]


def left_out(device: Discovered) -> dict[str, str]:
    return {o.what: o.reason for o in device.left_out}


AVAILABILITY = [
    {"topic": "zigbee2mqtt/bridge/state", "value_template": "{{ value_json.state }}",
     "payload_available": "online", "payload_not_available": "offline"},
]


def test_the_tool_uses_the_pinned_package() -> None:
    pinned = json.loads((z2m_devices.TOOL_DIR / "package.json").read_text())["dependencies"]
    assert pinned == {"zigbee-herdsman-converters": z2m_devices.package_version()}
    listed = z2m_devices.device_list()
    assert listed[0]["type"] == "Coordinator"
    assert [d["definition"]["model"] for d in listed[1:]] == list(z2m_devices.MODELS.values())


def test_every_device_but_the_coordinator_is_read_with_its_ieee_address(real: dict[str, Discovered]) -> None:
    assert set(real) == set(z2m_devices.MODELS)
    bulb = real["bulb"]
    assert bulb.key.source == "zigbee2mqtt:zigbee2mqtt"
    assert bulb.key.identifier == "0x00124b0000000001"
    assert (bulb.device.manufacturer, bulb.device.model) == ("IKEA", "LED1545G12")
    for device in real.values():
        assert device.components
        for c in device.components:
            assert c.component in COMPONENTS
            assert c.key == device.key and c.device == device.device
            assert c.discovery_topic == "zigbee2mqtt/bridge/devices"
            assert c.config["availability_mode"] == "all"
            assert c.config["availability"] == [*AVAILABILITY, {**AVAILABILITY[0],
                                                                "topic": f"zigbee2mqtt/{device.device.name}/availability"}]
        ids = [c.object_id for c in device.components]
        assert len(ids) == len(set(ids))


def test_a_white_spectrum_bulb_is_a_json_light_with_brightness_and_colour_temperature(
        real: dict[str, Discovered]) -> None:
    light = component(real["bulb"], "light")
    assert light.object_id == "light"
    config = dict(light.config)
    for key in ("availability", "availability_mode"):
        config.pop(key)
    assert config == {
        "name": None, "schema": "json", "command_topic": "zigbee2mqtt/bulb/set", "state_topic": "zigbee2mqtt/bulb",
        "brightness": True, "brightness_scale": 254, "min_mireds": 250, "max_mireds": 454,
        "supported_color_modes": ["color_temp"],
    }
    out = left_out(real["bulb"])
    # The effect and identify enums are write-only: nothing could confirm a command to them.
    assert "never publishes its state" in out["enum effect"]
    assert "never publishes its state" in out["enum identify"]
    assert "light (color_temp_startup)" in out


def test_a_colour_bulb_keeps_zigbee2mqtts_colour_modes(real: dict[str, Discovered]) -> None:
    light = component(real["hue_bulb"], "light")
    assert light.config["supported_color_modes"] == ["xy", "color_temp"]
    assert (light.config["min_mireds"], light.config["max_mireds"]) == (153, 500)
    # Hue's effect can be read and set, so the light lists it (as zigbee2mqtt's extension does) and it is a select.
    assert light.config["effect"] is True and "candle" in light.config["effect_list"]
    assert component(real["hue_bulb"], "select", "effect").config["command_topic"] == "zigbee2mqtt/hue_bulb/set/effect"


def test_a_plug_is_a_switch_with_metering_sensors(real: dict[str, Discovered]) -> None:
    plug = real["plug"]
    switch = component(plug, "switch")
    assert {k: switch.config[k] for k in ("command_topic", "state_topic", "value_template", "payload_on",
                                           "payload_off")} == {
        "command_topic": "zigbee2mqtt/plug/set", "state_topic": "zigbee2mqtt/plug",
        "value_template": '{{ value_json["state"] }}', "payload_on": "ON", "payload_off": "OFF"}
    power = component(plug, "sensor", "power")
    assert power.config["unit_of_measurement"] == "W"
    assert power.config["device_class"] == "power"
    assert power.config["value_template"] == '{{ value_json["power"] }}'
    assert "command_topic" not in power.config
    assert component(plug, "sensor", "linkquality").config["entity_category"] == "diagnostic"


def test_a_lock_is_a_lock_on_its_state(real: dict[str, Discovered]) -> None:
    lock = component(real["front_door"], "lock")
    assert {k: lock.config[k] for k in ("command_topic", "state_topic", "value_template", "state_locked",
                                         "state_unlocked", "payload_lock", "payload_unlock")} == {
        "command_topic": "zigbee2mqtt/front_door/set", "state_topic": "zigbee2mqtt/front_door",
        "value_template": '{{ value_json["state"] }}', "state_locked": "LOCK", "state_unlocked": "UNLOCK",
        "payload_lock": "LOCK", "payload_unlock": "UNLOCK"}
    out = left_out(real["front_door"])
    assert "composite pin_code" in out
    assert "enum action" in out


def test_a_radiator_valve_is_a_climate_with_its_setpoint_range(real: dict[str, Discovered]) -> None:
    climate = component(real["radiator"], "climate")
    assert {k: climate.config[k] for k in ("min_temp", "max_temp", "temp_step", "temperature_command_topic",
                                            "temperature_state_topic", "temperature_state_template",
                                            "current_temperature_template", "modes")} == {
        "min_temp": 5.0, "max_temp": 35.0, "temp_step": 0.5,
        "temperature_command_topic": "zigbee2mqtt/radiator/set/occupied_heating_setpoint",
        "temperature_state_topic": "zigbee2mqtt/radiator",
        "temperature_state_template": '{{ value_json["occupied_heating_setpoint"] }}',
        "current_temperature_template": '{{ value_json["local_temperature"] }}', "modes": ["heat"]}
    # The valve's demand is read-only: a sensor, never an actuator.
    demand = component(real["radiator"], "sensor", "pi_heating_demand")
    assert "command_topic" not in demand.config


def test_access_bits_decide_between_actuator_and_sensor(real: dict[str, Discovered]) -> None:
    trv = real["radiator"]
    # numeric: settable (access 7) -> number with its range and step; published only (5) -> sensor
    offset = component(trv, "number", "regulation_setpoint_offset")
    assert {k: offset.config[k] for k in ("min", "max", "step", "command_topic", "unit_of_measurement")} == {
        "min": -2.5, "max": 2.5, "step": 0.1, "command_topic": "zigbee2mqtt/radiator/set/regulation_setpoint_offset",
        "unit_of_measurement": "°C"}
    assert "command_topic" not in component(trv, "sensor", "load_estimate").config
    # enum: settable -> select with its options; published only -> sensor
    lockout = component(trv, "select", "keypad_lockout")
    assert lockout.config["options"] == ["unlock", "lock"]
    assert lockout.config["command_topic"] == "zigbee2mqtt/radiator/set/keypad_lockout"
    assert "command_topic" not in component(trv, "sensor", "window_open_internal").config
    # binary: settable -> switch on its own set topic; published only -> binary_sensor
    orientation = component(trv, "switch", "switch_thermostat_orientation")
    assert (orientation.config["payload_on"], orientation.config["payload_off"]) == ("vertical", "horizontal")
    assert orientation.config["command_topic"] == "zigbee2mqtt/radiator/set/thermostat_orientation"
    covered = component(trv, "switch", "switch_radiator_covered")  # a boolean binary
    assert (covered.config["payload_on"], covered.config["payload_off"]) == ("true", "false")
    assert covered.config["value_template"] == '{{ value_json["radiator_covered"] | lower }}'
    required = component(trv, "binary_sensor", "heat_required")
    assert (required.config["payload_on"], required.config["payload_off"]) == ("True", "False")
    assert "command_topic" not in required.config
    # and nothing that cannot be set has a command topic
    for device in real.values():
        for c in device.components:
            if c.component in ("sensor", "binary_sensor"):
                assert not any(k.endswith("command_topic") for k in c.config)


def test_a_blind_is_a_cover_with_a_position(real: dict[str, Discovered]) -> None:
    cover = component(real["blind"], "cover")
    assert {k: cover.config[k] for k in ("command_topic", "set_position_topic", "set_position_template",
                                         "position_template", "position_open", "position_closed")} == {
        "command_topic": "zigbee2mqtt/blind/set", "set_position_topic": "zigbee2mqtt/blind/set",
        "set_position_template": '{ "position": {{ position }} }',
        "position_template": '{{ value_json["position"] }}', "position_open": 100, "position_closed": 0}


def test_a_mode_controlled_fan_has_its_modes_as_presets(real: dict[str, Discovered]) -> None:
    fan = component(real["ceiling_fan"], "fan")
    assert fan.config["command_topic"] == "zigbee2mqtt/ceiling_fan/set/fan_state"
    assert fan.config["preset_modes"] == ["on", "smart"]
    assert "fan (speed)" in left_out(real["ceiling_fan"])
    assert component(real["ceiling_fan"], "light").config["supported_color_modes"] == ["brightness"]


def test_a_sensor_only_device_has_no_actuators(real: dict[str, Discovered]) -> None:
    sensor = real["hallway_climate"]
    assert {c.component for c in sensor.components} == {"sensor"}
    temperature = component(sensor, "sensor", "temperature")
    assert temperature.config["unit_of_measurement"] == "°C"
    assert temperature.config["device_class"] == "temperature"


def test_a_definition_whose_exposes_are_a_function_is_read(real: dict[str, Discovered]) -> None:
    # zigbee2mqtt calls such a definition's exposes with the device; the tool calls it with a stub device.
    valve = real["garden_valve"]
    assert component(valve, "switch", "switch").config["command_topic"] == "zigbee2mqtt/garden_valve/set"
    assert "command_topic" not in component(valve, "sensor", "real_time_irrigation_volume").config
    out = left_out(valve)
    duration = component(valve, "number", "irrigation_duration")  # access 3: published and settable
    assert (duration.config["min"], duration.config["max"], duration.config["entity_category"]) == (1, 719, "config")
    assert "composite irrigation_plan_remove" in out
    assert out["text rain_delay"] == "settable text is not mapped"


def test_a_settable_number_without_a_range_keeps_only_its_reading() -> None:
    # Home Assistant would read a number without min and max as 1..100; zigbee2mqtt gives none.
    unbounded = {"type": "numeric", "name": "duration", "property": "duration", "access": 7, "unit": "s"}
    (device,) = read(entry(exposes=[unbounded]))
    assert "command_topic" not in component(device, "sensor", "duration").config
    assert "no value_min and value_max" in left_out(device)["numeric duration (setting it)"]


def test_a_widened_definition_reads_as_a_wider_range() -> None:
    # What a newer converter (or an edited external one) announces: the tests' way to re-announce wider.
    wider = z2m_devices.changed(z2m_devices.device_list(), "bulb", "color_temp", value_min=153, value_max=500)
    (bulb,) = [d for d in read_devices(json.dumps(wider).encode()) if d.device.name == "bulb"]
    light = component(bulb, "light")
    assert (light.config["min_mireds"], light.config["max_mireds"]) == (153, 500)
    assert z2m_devices.device_list()[1]["definition"]["exposes"][0]["features"][2]["value_max"] == 454  # a copy


# -- hand-made and hostile input --------------------------------------------------------------------------------------

def entry(friendly: str = "lamp", exposes: list[Any] | None = None, **over: Any) -> dict[str, Any]:
    device: dict[str, Any] = {
        "ieee_address": "0x00158d0000000001", "type": "Router", "supported": True, "friendly_name": friendly,
        "disabled": False, "interview_completed": True, "interview_state": "SUCCESSFUL",
        "definition": {"model": "M1", "vendor": "V", "description": "d", "options": [],
                       "exposes": exposes if exposes is not None else [SWITCH]},
    }
    device.update(over)
    return device


STATE: dict[str, Any] = {"type": "binary", "name": "state", "property": "state", "access": 7, "value_on": "ON",
                         "value_off": "OFF"}
SWITCH: dict[str, Any] = {"type": "switch", "features": [STATE]}


def read(*devices: dict[str, Any], base: str = BASE) -> list[Discovered]:
    return read_devices(json.dumps(list(devices)).encode(), base)


def test_the_coordinator_is_skipped_and_unusable_devices_are_left_out_with_a_reason() -> None:
    found = read(
        {"ieee_address": "0x0000000000000000", "type": "Coordinator", "friendly_name": "Coordinator"},
        entry("a", ieee_address="0x0000000000000001", supported=False, definition=None),
        entry("b", ieee_address="0x0000000000000002", interview_state="IN_PROGRESS", interview_completed=False),
        entry("c", ieee_address="0x0000000000000003", disabled=True),
        entry("d", ieee_address="0x0000000000000004"),
    )
    reasons = {d.device.name: [o.reason for o in d.left_out] for d in found}
    assert list(reasons) == ["a", "b", "c", "d"]
    assert "does not support" in reasons["a"][0]
    assert "interviewing" in reasons["b"][0]
    assert "disabled" in reasons["c"][0]
    assert reasons["d"] == [] and [c.component for c in found[3].components] == ["switch"]
    assert all(not d.components for d in found[:3])


def test_the_base_topic_is_used_in_every_topic_and_the_source() -> None:
    (device,) = read(entry("room/lamp"), base="home/z2m")
    assert device.key.source == "zigbee2mqtt:home/z2m"
    switch = device.components[0]
    assert switch.config["command_topic"] == "home/z2m/room/lamp/set"
    assert switch.config["state_topic"] == "home/z2m/room/lamp"
    assert switch.config["availability"][0]["topic"] == "home/z2m/bridge/state"
    assert switch.config["availability"][1]["topic"] == "home/z2m/room/lamp/availability"


def test_endpoints_go_into_the_command_topic_and_the_object_id() -> None:
    l1 = {"type": "switch", "endpoint": "l1", "features": [{**STATE, "property": "state_l1"}]}
    (device,) = read(entry(exposes=[l1]))
    (switch,) = device.components
    assert switch.object_id == "switch_l1"
    assert switch.config["command_topic"] == "zigbee2mqtt/lamp/l1/set"
    assert switch.config["value_template"] == '{{ value_json["state_l1"] }}'


def test_settable_but_never_published_and_published_but_not_settable() -> None:
    write_only_light = {"type": "light", "features": [
        {"type": "binary", "name": "state", "property": "state", "access": 2, "value_on": "ON", "value_off": "OFF"}]}
    read_only_light = {"type": "light", "features": [
        {"type": "binary", "name": "state", "property": "state", "access": 1, "value_on": "ON", "value_off": "OFF"}]}
    dim_read_only = {"type": "light", "features": [
        {"type": "binary", "name": "state", "property": "state", "access": 7, "value_on": "ON", "value_off": "OFF"},
        {"type": "numeric", "name": "brightness", "property": "brightness", "access": 1, "value_min": 0,
         "value_max": 254}]}
    (a,) = read(entry(exposes=[write_only_light]))
    (b,) = read(entry(exposes=[read_only_light]))
    (c,) = read(entry(exposes=[dim_read_only]))
    assert not a.components and "never publishes" in a.left_out[0].reason
    assert not b.components and "cannot be set" in b.left_out[0].reason
    assert component(c, "light").config["brightness"] is False
    assert "cannot be set" in left_out(c)["light (brightness)"]


@pytest.mark.parametrize("friendly", ["a/+/b", "#", "a//b", "/a", "a/", "x/set", "x/availability", "", "bridge",
                                      "bridge/x", "tab\tname", "a" * 200])
def test_a_friendly_name_that_cannot_be_a_topic_leaves_the_device_out(friendly: str) -> None:
    (device,) = read(entry(friendly))
    assert not device.components
    assert device.left_out[0].what == "device"


def test_overlapping_friendly_names_leave_the_later_device_out() -> None:
    first, second = read(entry("hall"), entry("hall/l1", ieee_address="0x00158d0000000002"))
    assert first.components and not second.components
    assert "overlaps" in second.left_out[0].reason


@pytest.mark.parametrize("bad", [
    {"type": "numeric", "name": "x", "property": 'x"] }}{{ 7', "access": 7},
    {"type": "numeric", "name": "x", "property": "x", "access": 7, "value_min": 10, "value_max": 1},
    {"type": "numeric", "name": "x", "property": "x", "access": 7, "value_step": 0},
    {"type": "numeric", "name": "x", "property": "x", "access": 7, "value_max": True},
    {"type": "numeric", "name": "x", "property": "x", "access": 7, "value_min": 0, "value_max": 10**400},
    {"type": "climate", "features": [{"type": "numeric", "name": "occupied_heating_setpoint", "access": 7,
                                      "property": "occupied_heating_setpoint", "value_min": -(10**400),
                                      "value_max": 30},
                                     {"type": "numeric", "name": "local_temperature", "property": "local_temperature",
                                      "access": 1}]},
    {"type": "enum", "name": "x", "property": "x", "access": 7, "values": []},
    {"type": "enum", "name": "x", "property": "x", "access": 7, "values": [{"a": 1}]},
    {"type": "enum", "name": "x", "property": "x", "access": 7, "values": ["v"] * 1000},
    {"type": "binary", "name": "x", "property": "x", "access": 7, "value_on": "A", "value_off": "A"},
    {"type": "binary", "name": "x", "property": "x", "access": 7, "value_on": None, "value_off": "A"},
    {"type": "light", "features": "no"},
    {"type": "climate", "features": [{"type": "numeric", "name": "occupied_heating_setpoint",
                                      "property": "occupied_heating_setpoint", "access": 7}]},
    {"type": "teleporter"},
    {"type": "switch", "features": [STATE], "endpoint": "l1/../x"},
    "not an object",
])
def test_a_malformed_expose_is_left_out_and_the_rest_is_read(bad: Any) -> None:
    (device,) = read(entry(exposes=[bad, SWITCH]))
    assert [c.component for c in device.components] == ["switch"]
    assert len(device.left_out) == 1 and device.left_out[0].reason


@pytest.mark.parametrize("payload", [b"{", b"{}", b'"x"', b"\xff\xfe", b"[" * 100_000, b"NaN",
                                     b"x" * (MAX_PAYLOAD_BYTES + 1)])
def test_a_payload_that_is_not_a_device_list_is_unreadable(payload: bytes) -> None:
    with pytest.raises(UnreadableDevices):
        read_devices(payload)


def test_an_empty_payload_is_no_devices_and_sizes_are_bounded() -> None:
    assert read_devices(b"") == []
    many = [entry(f"d{i}", ieee_address=f"0x{i:016x}") for i in range(MAX_DEVICES + 5)]
    assert len(read(*many)) == MAX_DEVICES
    with pytest.raises(ValueError):
        read_devices(b"[]", base_topic="a/#")
    assert not valid_topic_name("a\x00b") and valid_topic_name("zigbee2mqtt")


def test_a_repeated_ieee_address_is_read_once() -> None:
    found = read(entry("a"), entry("b"))
    assert [d.device.name for d in found] == ["a"]


_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12))
_json = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                     max_leaves=8)
_keys = st.sampled_from(["type", "name", "property", "access", "value_on", "value_off", "value_min", "value_max",
                         "value_step", "values", "features", "endpoint", "unit", "label", "category"])
_expose = st.dictionaries(_keys, st.one_of(_json, st.sampled_from(
    ["light", "switch", "lock", "climate", "cover", "fan", "binary", "numeric", "enum", "text", "state",
     "brightness", "color_temp", "occupied_heating_setpoint", "local_temperature", "position", "mode", 1, 2, 3, 5, 7,
     "ON", "OFF"])), max_size=8)
_exposes = st.lists(st.one_of(_expose, st.builds(lambda f: {"type": "light", "features": f},
                                                 st.lists(_expose, max_size=4)), _json), max_size=5)


@given(st.lists(st.one_of(st.builds(lambda x, n: entry(n, exposes=x), _exposes, st.text(max_size=12)), _json),
                max_size=3))
def test_hostile_device_lists_never_crash(devices: list[Any]) -> None:
    try:
        found = read_devices(json.dumps(devices).encode())
    except UnreadableDevices:
        return
    for device in found:
        for c in device.components:
            assert c.component in COMPONENTS
            for key, value in c.config.items():
                if key.endswith("topic") and isinstance(value, str):
                    assert "+" not in value and "#" not in value
