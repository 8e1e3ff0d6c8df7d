"""Corral commands -> a bridged device's payloads, its state messages -> values, and what confirms a command
(bridge/codec.py, built by bridge/mapping.py). Configurations as in test_bridge_mapping: Home Assistant's documented
examples, and zigbee2mqtt devices from the pinned zigbee-herdsman-converters definitions."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.bridge.codec import DeviceCodec, InvalidValue, Publish
from corral.bridge.discovery import Catalog
from corral.bridge.exposes import read_devices
from corral.bridge.mapping import derive
from tests.unit.test_bridge_discovery import _hmd_configs
from tests.unit.test_bridge_mapping import discovered, one
from tests.z2m_devices import bridge_devices


def codec(component: str, config: dict[str, Any]) -> DeviceCodec:
    return one(component, config).codec


def test_switch_payloads_and_states() -> None:
    c = codec("switch", {"name": "Relay", "command_topic": "r/set", "state_topic": "r/state", "payload_on": "1",
                         "payload_off": "0", "state_on": "on", "state_off": "off", "qos": 1, "retain": True})
    assert c.command("obj0", True) == Publish("r/set", b"1", 1)
    assert c.command("obj0", False).payload == b"0"
    assert c.read("r/state", b"off").state == {"obj0": False}
    assert c.read("r/state", b"on").state == {"obj0": True}
    assert not c.read("r/state", b"1")  # the command payload is not a state
    assert not c.read("other/topic", b"on")


def test_lock_payloads_and_states_other_states_are_no_value() -> None:
    c = codec("lock", {"command_topic": "d/set", "state_topic": "d/state"})
    assert c.command("obj0", True).payload == b"LOCK" and c.command("obj0", False).payload == b"UNLOCK"
    assert c.read("d/state", b"LOCKED").state == {"obj0": True}
    assert c.read("d/state", b"UNLOCKED").state == {"obj0": False}
    assert not c.read("d/state", b"JAMMED") and not c.read("d/state", b"LOCKING")


def test_json_light_commands_carry_state_and_brightness() -> None:
    c = codec("light", {"schema": "json", "command_topic": "l/set", "state_topic": "l", "brightness": True,
                        "brightness_scale": 254, "supported_color_modes": ["color_temp"]})
    assert c.command("obj0", True).payload == b'{"state":"ON"}'
    assert c.command("obj0_brightness", 120).payload == b'{"state":"ON","brightness":120}'
    assert c.command("obj0_color_temp", 300).payload == b'{"state":"ON","color_temp":300}'
    read = c.read("l", b'{"state":"ON","brightness":119,"color_temp":300,"color_mode":"color_temp"}')
    assert read.state == {"obj0": True, "obj0_brightness": 119, "obj0_color_temp": 300}


def test_default_light_uses_its_own_topics_and_value_templates() -> None:
    c = codec("light", {
        "command_topic": "o/switch", "state_topic": "o/status", "state_value_template": "{{ value_json.state }}",
        "brightness_command_topic": "o/b/set", "brightness_state_topic": "o/b",
        "brightness_value_template": "{{ value_json.level }}", "brightness_scale": 100})
    assert c.command("obj0_brightness", 40) == Publish("o/b/set", b"40")
    assert c.read("o/b", b'{"level": 40}').state == {"obj0_brightness": 40}
    assert c.read("o/status", b'{"state": "OFF"}').state == {"obj0": False}


def test_template_light_renders_its_on_template_with_the_brightness() -> None:
    c = codec("light", {
        "schema": "template", "command_topic": "t/set", "state_topic": "t",
        "command_on_template": '{"state": "on"{%- if brightness is defined -%}, "brightness": {{ brightness }}'
                               '{%- endif -%}}',
        "command_off_template": '{"state": "off"}', "state_template": "{{ value_json.state }}",
        "brightness_template": "{{ value_json.brightness }}"})
    assert c.command("obj0", True).payload == b'{"state": "on"}'
    assert c.command("obj0", False).payload == b'{"state": "off"}'
    assert c.command("obj0_brightness", 77).payload == b'{"state": "on", "brightness": 77}'
    assert c.read("t", b'{"state": "on", "brightness": 77}').state == {"obj0": True, "obj0_brightness": 77}


def test_out_of_range_and_off_step_and_wrong_type_are_refused_before_any_payload() -> None:
    c = codec("number", {"command_topic": "n/set", "state_topic": "n", "min": 0, "max": 10, "step": 0.5,
                         "command_template": '{"v": {{ value }}}'})
    assert c.command("obj0", 2.5).payload == b'{"v": 2.5}'
    for bad in (11, -1, 2.2, True, "5"):
        with pytest.raises(InvalidValue):
            c.command("obj0", bad)
    with pytest.raises(KeyError):
        c.command("nope", 1)


def test_select_maps_slugged_options_both_ways() -> None:
    c = codec("select", {"command_topic": "s/set", "state_topic": "s", "options": ["Eco Mode", "Comfort"]})
    assert c.command("obj0", "Eco_Mode").payload == b"Eco Mode"
    assert c.read("s", b"Eco Mode").state == {"obj0": "Eco_Mode"}
    assert not c.read("s", b"Turbo")
    with pytest.raises(InvalidValue):
        c.command("obj0", "Eco Mode")


def test_cover_position_in_percent_over_the_devices_own_scale() -> None:
    c = codec("cover", {"command_topic": "c/set", "position_topic": "c/pos", "set_position_topic": "c/pos/set",
                        "position_open": 255, "position_closed": 0,
                        "set_position_template": '{"position": {{ position }}}'})
    assert c.command("obj0", 50).payload == b'{"position": 128}'
    observed = c.read("c/pos", b"128").state["obj0"]
    assert observed == 50 and c.confirms("obj0", 50, observed)
    assert not c.confirms("obj0", 50, c.read("c/pos", b"140").state["obj0"])


def test_fan_presets_and_speed() -> None:
    c = codec("fan", {"command_topic": "f/set", "state_topic": "f", "payload_on": "true", "payload_off": "false",
                      "preset_mode_command_topic": "f/p/set", "preset_mode_state_topic": "f/p",
                      "preset_modes": ["auto", "eco"], "percentage_command_topic": "f/s/set",
                      "percentage_state_topic": "f/s", "speed_range_max": 10})
    assert c.command("obj0", True).payload == b"true"
    assert c.command("obj0_preset_mode", "eco") == Publish("f/p/set", b"eco")
    assert c.command("obj0_speed", 3) == Publish("f/s/set", b"3")
    assert c.read("f/s", b"3").state == {"obj0_speed": 3}


def test_climate_target_temperature_and_current_temperature_reading() -> None:
    c = codec("climate", {"temperature_command_topic": "c/t/set", "temperature_state_topic": "c/t",
                          "current_temperature_topic": "c/cur", "temp_step": 0.5, "min_temp": 5, "max_temp": 30})
    assert c.command("obj0_target_temperature", 21.5).payload == b"21.5"
    assert c.command("obj0_target_temperature", 21).payload == b"21"
    assert c.read("c/t", b"21.5").state == {"obj0_target_temperature": 21.5}
    assert c.read("c/cur", b"19.8").readings == {"obj0_temperature": 19.8}


def test_sensor_readings_skip_what_is_not_a_value() -> None:
    derived = derive(discovered(
        ("sensor", {"state_topic": "env", "unit_of_measurement": "°C",
                    "value_template": "{{ value_json.temperature }}"}),
        ("binary_sensor", {"state_topic": "motion", "device_class": "motion"})))
    c = derived.codec
    assert c.read("env", b'{"temperature": 21.4}').readings == {"obj0": 21.4}
    assert not c.read("env", b'{"temperature": "warm"}') and not c.read("env", b"not json")
    assert not c.read("env", b'{"temperature": NaN}')
    assert c.read("motion", b"ON").readings == {"obj1": True}
    assert not c.read("motion", b"\xff\xfe")


def test_confirmation_rule() -> None:
    c = codec("light", {"schema": "json", "command_topic": "l/set", "state_topic": "l", "brightness": True})
    assert c.confirms("obj0_brightness", 120, 120) and c.confirms("obj0_brightness", 120, 120.0)
    assert not c.confirms("obj0_brightness", 120, 119)  # step 1: the device reports another step
    assert not c.confirms("obj0_brightness", 120, True)
    assert c.confirms("obj0", True, True) and not c.confirms("obj0", True, 1) and not c.confirms("obj0", True, False)
    t = codec("climate", {"temperature_command_topic": "c/t/set", "temperature_state_topic": "c/t",
                          "temp_step": 0.5})
    assert t.confirms("obj0_target_temperature", 21.5, 21.6) and not t.confirms("obj0_target_temperature", 21.5, 22)


def test_availability_topics_and_modes() -> None:
    derived = one("switch", {"command_topic": "a/set", "state_topic": "a",
                             "availability": [{"topic": "bridge/state", "value_template": "{{ value_json.state }}"},
                                              {"topic": "a/availability", "payload_available": "up",
                                               "payload_not_available": "down"}],
                             "availability_mode": "all"})
    av = derived.codec.availability
    assert derived.topics.availability == ("a/availability", "bridge/state")
    by_topic = {t.topic: t for t in av.topics}
    assert by_topic["bridge/state"].read(b'{"state": "online"}') is True
    assert by_topic["a/availability"].read(b"down") is False
    assert by_topic["a/availability"].read(b"online") is None
    assert av.online({"bridge/state": True}, True) is True
    assert av.online({"bridge/state": True, "a/availability": False}, True) is False
    assert av.online({}, None) is None


def test_zigbee2mqtt_bulb_plug_lock_and_blind_round_trip() -> None:
    devices = {d.key.identifier: derive(d) for d in read_devices(bridge_devices(
        bulb="LED1545G12", plug="SP 120", front_door="YRD226HA2619", blind="E1757"))}
    bulb = devices["0x00124b0000000001"].codec
    assert bulb.command("light_brightness", 120) == Publish("zigbee2mqtt/bulb/set",
                                                            b'{"state":"ON","brightness":120}')
    state = {"state": "ON", "brightness": 120, "color_temp": 370, "linkquality": 87, "power_on_behavior": "previous"}
    read = bulb.read("zigbee2mqtt/bulb", json.dumps(state).encode())
    assert read.state == {"light": True, "light_brightness": 120, "light_color_temp": 370,
                          "power_on_behavior": "previous"}
    assert read.readings == {"linkquality": 87}
    assert bulb.command("power_on_behavior", "off") == Publish("zigbee2mqtt/bulb/set/power_on_behavior", b"off")
    plug = devices["0x00124b0000000002"].codec
    assert plug.command("switch", True) == Publish("zigbee2mqtt/plug/set", b"ON")
    assert plug.read("zigbee2mqtt/plug", b'{"state": "OFF", "power": 3.5}').state == {"switch": False}
    lock = devices["0x00124b0000000003"].codec
    assert lock.command("lock", False).payload == b"UNLOCK"
    assert lock.read("zigbee2mqtt/front_door", b'{"state": "LOCK", "battery": 90}').state["lock"] is True
    blind = devices["0x00124b0000000004"].codec
    assert blind.command("cover", 30) == Publish("zigbee2mqtt/blind/set", b'{ "position": 30 }')
    assert blind.read("zigbee2mqtt/blind", b'{"position": 30, "state": "OPEN"}').state == {"cover": 30}


_payloads = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=40).map(str.encode),
    st.dictionaries(st.sampled_from(["state", "brightness", "color_temp", "position", "temperature", "x"]),
                    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                              st.lists(st.integers(), max_size=3)), max_size=5).map(lambda d: json.dumps(d).encode()))


@settings(max_examples=300, deadline=None)
@given(_payloads)
def test_any_state_payload_reads_as_values_of_the_contracts_types_or_nothing(payload: bytes) -> None:
    derived = derive(discovered(
        ("light", {"schema": "json", "command_topic": "l/set", "state_topic": "s", "brightness": True,
                   "supported_color_modes": ["color_temp"]}),
        ("select", {"command_topic": "m/set", "state_topic": "s", "options": ["a b", "c"],
                    "value_template": "{{ value_json.state }}"}),
        ("cover", {"command_topic": "c/set", "position_topic": "s", "set_position_topic": "c/p",
                   "position_template": "{{ value_json.position }}"}),
        ("sensor", {"state_topic": "s", "value_template": "{{ value_json.temperature | float }}"})))
    observed = derived.codec.read("s", payload)
    for actuator_id, value in observed.state.items():
        actuator = derived.contract.actuator(actuator_id)
        assert actuator is not None
        if actuator.type == "bool":
            assert isinstance(value, bool)
        elif actuator.type == "enum":
            assert value in (actuator.values or [])
        else:
            assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    for value in observed.readings.values():
        assert isinstance(value, (int, float)) and math.isfinite(value)


def test_ha_mqtt_discoverable_devices_round_trip_as_the_library_publishes_state() -> None:
    catalog = Catalog()
    for topic, payload in _hmd_configs().values():
        catalog.update(topic, payload)
    (porch,) = catalog.devices()
    derived = derive(porch)
    assert not derived.left_out
    c = derived.codec
    assert {a.id: (a.action, a.risk) for a in derived.contract.actuators} == {
        "lamp": ("set_state", "low"), "lamp_brightness": ("set_value", "low"), "door": ("set_state", "high"),
        "tap": ("set_state", "high"), "fountain": ("set_state", "medium"), "level": ("set_value", "medium"),
        "scene": ("set_mode", "medium")}
    assert c.command("lamp_brightness", 120) == Publish("hmd/light/Porch/Lamp/command",
                                                        b'{"state":"ON","brightness":120}')
    # What the library's Light.brightness(120), Lock.locked(), Valve.open() and Sensor.set_state(21.5) publish.
    assert c.read("hmd/light/Porch/Lamp/state", b'{"brightness": 120, "state": "ON"}').state == {
        "lamp": True, "lamp_brightness": 120}
    assert c.command("door", True) == Publish("hmd/lock/Porch/Door/command", b"LOCK")
    assert c.read("hmd/lock/Porch/Door/state", b"LOCKED").state == {"door": True}
    assert not c.read("hmd/lock/Porch/Door/state", b"JAMMED")
    assert c.command("tap", True) == Publish("hmd/valve/Porch/Tap/command", b"OPEN")
    assert c.read("hmd/valve/Porch/Tap/state", b"open").state == {"tap": True}
    assert c.read("hmd/sensor/Porch/Temp/state", b"21.5").readings == {"temp": 21.5}
    assert c.read("hmd/binary_sensor/Porch/Motion/state", b"on").readings == {"motion": True}  # its payload_on
    with pytest.raises(InvalidValue):
        c.command("lamp_brightness", 256)


@pytest.mark.parametrize("number", ["9" * 400, "-" + "9" * 400, "1e400"])
def test_a_state_with_a_number_beyond_floats_range_is_no_value_and_the_next_one_reads(number: str) -> None:
    """Issue 41, finding 12: a 400-digit number in a state escaped as OverflowError, one traceback per message."""
    derived = derive(discovered(
        ("light", {"schema": "json", "command_topic": "l/set", "state_topic": "s", "brightness": True,
                   "supported_color_modes": ["brightness"]}),
        ("cover", {"command_topic": "c/set", "position_topic": "p", "set_position_topic": "c/p",
                   "position_open": 255, "position_template": "{{ value_json.position }}"}),
        ("sensor", {"state_topic": "t", "value_template": "{{ value_json.temperature | float }}"}),
        ("number", {"command_topic": "n/set", "state_topic": "n"})))
    c = derived.codec
    assert not c.read("s", b'{"state": "ON", "brightness": %s}' % number.encode()).state.get("obj0_brightness")
    assert not c.read("p", b'{"position": %s}' % number.encode()).state
    assert not c.read("t", b'{"temperature": %s}' % number.encode()).readings
    assert not c.read("n", number.encode()).state
    assert c.read("s", b'{"state": "ON", "brightness": 120}').state == {"obj0": True, "obj0_brightness": 120}
    assert c.read("t", b'{"temperature": 21.5}').readings == {"obj2": 21.5}
    assert c.read("n", b"42").state == {"obj3": 42}
