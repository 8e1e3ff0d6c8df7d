"""Reading Home Assistant MQTT discovery (bridge/discovery.py): Home Assistant's documented examples, the configs
ha-mqtt-discoverable really publishes, abbreviations, `~`, device-based discovery, removal, and hostile input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from ha_mqtt_discoverable import DeviceInfo as HmdDevice
from ha_mqtt_discoverable import Settings
from ha_mqtt_discoverable.sensors import (
    BinarySensor,
    BinarySensorInfo,
    Light,
    LightInfo,
    Lock,
    LockInfo,
    Number,
    NumberInfo,
    Select,
    SelectInfo,
    Sensor,
    SensorInfo,
    Switch,
    SwitchInfo,
    Valve,
    ValveInfo,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion

from corral.bridge.discovery import (
    ABBREVIATIONS,
    MAX_CONFIG_BYTES,
    Availability,
    AvailabilityTopic,
    Catalog,
    Reading,
    availability,
    read_config,
)
from corral.bridge.model import Component, DeviceInfo, DeviceKey

EXAMPLES: dict[str, Any] = json.loads((Path(__file__).parents[1] / "data/bridge/ha/examples.json").read_text())


def example(name: str) -> tuple[str, bytes]:
    entry = EXAMPLES[name]
    return entry["topic"], json.dumps(entry["payload"]).encode()


def one(reading: Reading) -> Component:
    assert not reading.left_out, reading.left_out
    assert len(reading.components) == 1, reading
    return reading.components[0]


def test_the_documented_motion_sensor() -> None:
    component = one(read_config(*example("binary_sensor_motion")))
    assert component.component == "binary_sensor" and component.object_id == "garden"
    assert component.key == DeviceKey("ha:garden", "01ad")  # the source is the topic's: no node id, its object id
    assert component.device == DeviceInfo(name="Garden")
    assert component.config["state_topic"] == "homeassistant/binary_sensor/garden/state"
    assert component.discovery_topic == "homeassistant/binary_sensor/garden/config"


def under_node(node: str, topic: str, payload: bytes) -> tuple[str, bytes]:
    """A documented example announced under a node id (`<prefix>/<component>/<node>/<object>/config`)."""
    prefix, component, rest = topic.split("/", 2)
    return f"{prefix}/{component}/{node}/{rest}", payload


def test_components_of_one_device_group_together() -> None:
    catalog = Catalog()
    key = DeviceKey("ha:bedroom", "bedroom01ae")
    assert catalog.update(*under_node("bedroom", *example("sensor_temperature"))) == {key}
    catalog.update(*under_node("bedroom", *example("sensor_humidity")))
    [bedroom] = catalog.devices()
    assert [c.object_id for c in bedroom.components] == ["sensorBedroomH", "sensorBedroomT"]
    assert bedroom.device.name == "Bedroom" and bedroom.device.model == "Example Sensor"
    assert bedroom.device.sw_version == "2024.1.0" and bedroom.device.manufacturer == "Example sensors Ltd."
    assert catalog.device(bedroom.key) == bedroom


def test_abbreviations_and_the_base_topic() -> None:
    switch = one(read_config(*example("switch_abbreviated")))
    assert dict(switch.config) == {"name": "garden", "command_topic": "homeassistant/switch/irrigation/set",
                                   "state_topic": "homeassistant/switch/irrigation/state"}
    light = one(read_config(*example("light_json_abbreviated")))
    assert light.config["unique_id"] == "kitchen_light" and light.config["schema"] == "json"
    assert light.config["command_topic"] == "homeassistant/light/kitchen/set"
    climate = one(read_config(*example("climate_abbreviated")))
    assert climate.config["mode_state_template"] == "{{value_json.mode}}"
    assert climate.config["temperature_command_topic"] == "homeassistant/climate/livingroom/targetTempCmd"
    assert climate.config["current_temperature_template"] == "{{value_json.current_temp}}"
    assert availability(climate.config) == Availability("latest", (AvailabilityTopic(
        "homeassistant/climate/livingroom/available", "online", "offline"),))


def test_base_topic_at_either_end_and_in_availability() -> None:
    payload = {"~": "base/x", "cmd_t": "~/set", "stat_t": "state/~", "json_attr_t": "mid~dle", "pos_t": "~/p/~",
               "avty": [{"t": "~/avail", "pl_avail": "up"}], "name": "~/not-a-topic", "uniq_id": "u1"}
    switch = one(read_config("homeassistant/switch/node1/sw/config", json.dumps(payload).encode()))
    assert switch.config["command_topic"] == "base/x/set" and switch.config["state_topic"] == "state/base/x"
    assert switch.config["json_attributes_topic"] == "mid~dle" and switch.config["name"] == "~/not-a-topic"
    assert switch.config["position_topic"] == "~/p/base/x"  # Home Assistant's result for ~ at both ends
    assert "~" not in switch.config
    assert availability(switch.config).topics == (AvailabilityTopic("base/x/avail", "up", "offline"),)
    assert switch.key == DeviceKey("ha:node1", "node1")  # no device: grouped by the node


def test_the_abbreviation_list_is_home_assistants() -> None:
    # A few from Home Assistant's abbreviations.py, old and new.
    for short, full in (("cmd_t", "command_topic"), ("stat_val_tpl", "state_value_template"), ("p", "platform"),
                        ("cmps", "components"), ("o", "origin"), ("pos", "reports_position"),
                        ("stat_jam", "state_jammed"), ("pr_modes", "preset_modes"), ("avty", "availability"),
                        ("pl_avail", "payload_available"), ("clr_temp_cmd_t", "color_temp_command_topic")):
        assert ABBREVIATIONS[short] == full
    assert len(set(ABBREVIATIONS.values())) == len(ABBREVIATIONS)


def test_device_based_discovery() -> None:
    reading = read_config(*example("device_based"))
    assert not reading.left_out
    temperature, humidity = reading.components
    assert {temperature.object_id, humidity.object_id} == {"some_unique_component_id1", "some_unique_id2"}
    key = DeviceKey("ha:0AFFD2", "0AFFD2")
    assert temperature.key == humidity.key == key
    assert temperature.component == "sensor" and "platform" not in temperature.config
    assert temperature.config["state_topic"] == "sensorBedroom/state"  # shared from the device level
    assert temperature.config["qos"] == 2
    assert temperature.config["origin"] == {"name": "bla2mqtt", "sw_version": "2.1",
                                            "support_url": "https://bla2mqtt.example.com/support"}
    assert temperature.config["device"]["serial_number"] == "ea334450945afc"
    assert temperature.device == DeviceInfo("Kitchen", "Bla electronics", "xya", "1.0")
    catalog = Catalog()
    catalog.update(*example("device_based"))
    [kitchen] = catalog.devices()
    assert kitchen.key == key and len(kitchen.components) == 2


def test_device_based_components_override_shared_options_and_get_their_own_base() -> None:
    payload = {"dev": {"ids": ["d1"]}, "o": {"name": "x"}, "~": "dev/d1", "stat_t": "~/state",
               "avty_t": "~/avail",
               "cmps": {"relay": {"p": "switch", "cmd_t": "~/relay/set", "stat_t": "~/relay/state"},
                        "temp": {"p": "sensor", "val_tpl": "{{ value_json.t }}"},
                        "gone": {"p": "sensor"},
                        "cam": {"p": "camera", "topic": "dev/d1/cam"}}}
    reading = read_config("homeassistant/device/d1/config", json.dumps(payload).encode())
    relay, temp = sorted(reading.components, key=lambda c: c.object_id)
    assert relay.config["state_topic"] == "dev/d1/relay/state" and relay.config["command_topic"] == "dev/d1/relay/set"
    assert temp.config["state_topic"] == "dev/d1/state" and temp.config["availability_topic"] == "dev/d1/avail"
    [camera] = reading.left_out
    assert camera.item.what == "camera.cam" and "not one the bridge maps" in camera.item.reason


@pytest.mark.parametrize(("payload", "reason"), [
    ({"dev": {"ids": ["d1"]}, "cmps": {"a": {"p": "switch", "cmd_t": "x"}}}, "no origin"),
    ({"dev": {"name": "n"}, "o": {"name": "x"}, "cmps": {"a": {"p": "switch", "cmd_t": "x"}}},
     "neither identifiers nor connections"),
    ({"dev": {"ids": ["d1"]}, "o": {"name": "x"}, "cmps": {}}, "no components"),
    ({"dev": {"ids": ["d1"]}, "o": {"name": "x"}, "cmps": [1]}, "no components"),
])
def test_malformed_device_based_discovery_is_left_out(payload: dict[str, Any], reason: str) -> None:
    reading = read_config("homeassistant/device/d1/config", json.dumps(payload).encode())
    assert not reading.components
    [item] = reading.left_out
    assert reason in item.item.reason and item.key == DeviceKey("ha:d1", "d1")


def test_every_documented_component_is_read() -> None:
    expected = {"light_default": "light", "light_json_color_temp": "light", "light_template": "light",
                "fan_presets": "fan", "cover": "cover", "lock": "lock", "valve_position": "valve",
                "number": "number", "select": "select"}
    for name, component_name in expected.items():
        component = one(read_config(*example(name)))
        assert component.component == component_name
    fan = one(read_config(*example("fan_presets")))
    assert fan.config["preset_modes"] == ["auto", "smart", "whoosh", "eco", "breeze"]
    cover = one(read_config(*example("cover")))
    assert availability(cover.config) == Availability(
        "latest", (AvailabilityTopic("living-room-cover/availability", "online", "offline"),))
    valve = one(read_config(*example("valve_position")))
    assert valve.config["reports_position"] is True


def test_without_a_node_id_a_payload_cannot_claim_another_source() -> None:
    """Issue 41, finding 7: the source came from the payload's device identifiers for a topic without a node id, so
    one source could announce components of another's device. It is the topic's publisher now (the broker lets only
    the source whose node id is the topic's object id publish there), whatever the payload says."""
    catalog = Catalog()
    catalog.update(*example("sensor_temperature"))
    catalog.update(*example("sensor_humidity"))  # the same device identifiers, from another topic: another source
    assert [d.key for d in catalog.devices()] == [DeviceKey("ha:sensorBedroomH", "bedroom01ae"),
                                                  DeviceKey("ha:sensorBedroomT", "bedroom01ae")]
    claim = {"name": "Lock?", "cmd_t": "victim/lock/set", "stat_t": "victim/lock/state", "pl_on": "UNLOCK",
             "dev": {"ids": ["victim-id"], "name": "victim"}}
    component = one(read_config("homeassistant/light/attacker/config", json.dumps(claim).encode()))
    assert component.key == DeviceKey("ha:attacker", "victim-id")


def test_an_empty_payload_removes_what_the_topic_announced() -> None:
    catalog = Catalog()
    catalog.update(*under_node("bedroom", *example("sensor_temperature")))
    catalog.update(*under_node("bedroom", *example("sensor_humidity")))
    key = DeviceKey("ha:bedroom", "bedroom01ae")
    assert read_config("homeassistant/sensor/bedroom/sensorBedroomT/config", b"").removed
    assert read_config("homeassistant/sensor/bedroom/sensorBedroomT/config", b"{}").removed  # as in Home Assistant
    assert catalog.update("homeassistant/sensor/bedroom/sensorBedroomT/config", b"") == {key}
    [bedroom] = catalog.devices()
    assert [c.object_id for c in bedroom.components] == ["sensorBedroomH"]
    catalog.update("homeassistant/sensor/bedroom/sensorBedroomH/config", b"")
    assert catalog.devices() == [] and catalog.device(key) is None


def test_a_reannounced_device_replaces_its_components() -> None:
    catalog = Catalog()
    catalog.update(*example("device_based"))
    payload = dict(EXAMPLES["device_based"]["payload"])
    payload["cmps"] = {"some_unique_id2": payload["cmps"]["some_unique_id2"]}
    catalog.update("homeassistant/device/0AFFD2/config", json.dumps(payload).encode())
    [kitchen] = catalog.devices()
    assert [c.object_id for c in kitchen.components] == ["some_unique_id2"]


@pytest.mark.parametrize(("topic", "why"), [
    ("homeassistant/switch/a/b/c/config", "not <prefix>"),
    ("homeassistant/switch/x", "not <prefix>"),
    ("other/switch/x/config", "discovery prefix"),
    ("homeassistant/switch/bad id/config", "[a-zA-Z0-9_-]"),
    ("homeassistant/sw-itch/x/config", "not a word"),
    ("homeassistant/switch/x/state", "not <prefix>"),
])
def test_topics_that_are_not_discovery_are_ignored(topic: str, why: str) -> None:
    reading = read_config(topic, b'{"cmd_t": "a"}')
    assert why in reading.ignored and not reading.components and not reading.left_out
    assert Catalog().update(topic, b"{}") == set()


@pytest.mark.parametrize(("payload", "reason"), [
    (b"not json", "not UTF-8 JSON"),
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"cmd_t": NaN}', "not UTF-8 JSON"),
    (b"[" * 10_000 + b"]" * 10_000, "larger than"),
    (b"[" * 5000 + b"]" * 5000, "not UTF-8 JSON"),
    (b'{"cmd_t": "x", "pad": "' + b"a" * MAX_CONFIG_BYTES + b'"}', "larger than 16384 bytes"),
    (b'{"cmd_t": 5}', "command_topic is not text"),
    (b'{"cmd_t": ""}', "empty"),
    (b'{"cmd_t": "a/\\u0000"}', "NUL"),
    (b'{"cmd_t": "a/+/set"}', "wildcard"),
    (b'{"stat_t": "#"}', "wildcard"),
    (b'{"cmd_t": "iot/dev-1/cmd"}', "reserved"),
    (b'{"stat_t": "$SYS/broker/uptime"}', "reserved"),
    (b'{"cmd_t": "a", "~": 5}', "base topic"),
    (b'{"cmd_t": "a", "avty_t": "x", "avty": [{"t": "y"}]}', "both availability_topic and availability"),
    (b'{"cmd_t": "a", "avty": [{"pl_avail": "on"}]}', "no topic"),
    (b'{"cmd_t": "a", "avty": "x"}', "no topic"),
    (b'{"cmd_t": "a", "avty_t": "x", "pl_avail": {}}', "payload_available is not text"),
    (b'{"cmd_t": "a", "avty_mode": "most"}', "availability_mode"),
    (b'{"cmd_t": "a", "dev": {"name": "x"}}', "neither identifiers nor connections"),
    (b'{"cmd_t": "a", "dev": "x"}', "device is not a JSON object"),
    (b'{"cmd_t": "a", "dev": {"ids": ["' + b"x" * 300 + b'"]}}', "identifier is longer than 256"),
    (b'{"cmd_t": "a", "o": {"sw": "1"}}', "origin has no name"),
])
def test_malformed_configs_are_left_out_with_a_reason(payload: bytes, reason: str) -> None:
    reading = read_config("homeassistant/switch/node/obj/config", payload)
    assert not reading.components
    [item] = reading.left_out
    assert reason in item.item.reason, item.item.reason
    assert item.item.what == "switch.obj" and item.item.reason.endswith(".")
    assert item.key.source == "ha:node"


def test_unmapped_components_are_left_out_but_keep_their_device() -> None:
    payload = {"name": "Doorbell", "cmd_t": "door/press", "uniq_id": "b1", "dev": {"ids": ["door"], "name": "Door"}}
    reading = read_config("homeassistant/button/door/config", json.dumps(payload).encode())
    [item] = reading.left_out
    assert item.key == DeviceKey("ha:door", "door") and item.device.name == "Door"
    assert item.item.what == "button.door"
    catalog = Catalog()
    catalog.update("homeassistant/button/door/config", json.dumps(payload).encode())
    [door] = catalog.devices()
    assert door.components == () and door.left_out == (item.item,)


def test_identifier_falls_back_to_connections_then_unique_id() -> None:
    by_connection = {"cmd_t": "a", "dev": {"cns": [["mac", "02:5b:26:a8:dc:12"]]}}
    component = one(read_config("homeassistant/switch/plug/config", json.dumps(by_connection).encode()))
    assert component.key == DeviceKey("ha:plug", "mac:02:5b:26:a8:dc:12")
    by_unique_id = {"cmd_t": "a", "uniq_id": "plug-1"}
    component = one(read_config("homeassistant/switch/plug/config", json.dumps(by_unique_id).encode()))
    assert component.key == DeviceKey("ha:plug", "plug-1")
    bare = {"cmd_t": "a"}
    assert one(read_config("homeassistant/switch/plug/config", json.dumps(bare).encode())).key == DeviceKey(
        "ha:plug", "plug")
    string_ids = {"cmd_t": "a", "dev": {"ids": "serial-9", "name": 7}}
    component = one(read_config("homeassistant/switch/n1/plug/config", json.dumps(string_ids).encode()))
    assert component.key == DeviceKey("ha:n1", "serial-9") and component.device.name == "7"


def test_availability_defaults_and_modes() -> None:
    assert availability({}) == Availability()
    listed = {"availability": [{"topic": "a", "payload_available": 1}, {"topic": "b", "value_template": "{{ v }}"}],
              "availability_mode": "all"}
    assert availability(listed) == Availability("all", (AvailabilityTopic("a", "1", "offline"),
                                                        AvailabilityTopic("b", "online", "offline", "{{ v }}")))
    single = {"availability_topic": "t", "payload_not_available": "dead", "availability_template": "{{ value }}"}
    assert availability(single) == Availability("latest", (AvailabilityTopic("t", "online", "dead", "{{ value }}"),))


# ---------------------------------------------------------------------------------------------------------------
# ha-mqtt-discoverable: the discovery JSON its entity classes really publish, captured without a broker.


class _Capture(mqtt.Client):
    """A paho client that never connects: it keeps what the library publishes (its discovery configs)."""

    def __init__(self) -> None:
        super().__init__(callback_api_version=CallbackAPIVersion.VERSION2)
        self.published: list[tuple[str, bytes, bool]] = []

    def subscribe(self, *args: Any, **kwargs: Any) -> tuple[mqtt.MQTTErrorCode, int]:
        return mqtt.MQTT_ERR_SUCCESS, 1

    def publish(self, topic: str, payload: Any = None, qos: int = 0, retain: bool = False,
                properties: Any = None) -> mqtt.MQTTMessageInfo:
        self.published.append((topic, payload.encode() if isinstance(payload, str) else payload, retain))
        info = mqtt.MQTTMessageInfo(len(self.published))
        info.rc = mqtt.MQTT_ERR_SUCCESS
        return info


def _hmd_configs() -> dict[str, tuple[str, bytes]]:
    client = _Capture()
    device = HmdDevice(name="Porch", identifiers=["porch-01"], manufacturer="Acme", model="P1", sw_version="0.3")
    mqtt_settings = Settings.MQTT(client=client)

    def ignore(*_: Any) -> None:
        return None

    entities = [
        Light(Settings(mqtt=mqtt_settings, entity=LightInfo(name="Lamp", unique_id="porch-lamp", device=device,
                                                            brightness=True)), ignore),
        Lock(Settings(mqtt=mqtt_settings, entity=LockInfo(name="Door", unique_id="porch-door", device=device)),
             ignore),
        Valve(Settings(mqtt=mqtt_settings, entity=ValveInfo(name="Tap", unique_id="porch-tap", device=device)),
              ignore),
        Switch(Settings(mqtt=mqtt_settings, entity=SwitchInfo(name="Fountain", unique_id="porch-fountain",
                                                              device=device)), ignore),
        Number(Settings(mqtt=mqtt_settings, entity=NumberInfo(name="Level", unique_id="porch-level", device=device,
                                                              min=0, max=10, step=0.5)), ignore),
        Select(Settings(mqtt=mqtt_settings, entity=SelectInfo(name="Scene", unique_id="porch-scene", device=device,
                                                              options=["day", "night"])), ignore),
        Sensor(Settings(mqtt=mqtt_settings, entity=SensorInfo(name="Temp", unique_id="porch-temp", device=device,
                                                              device_class="temperature",
                                                              unit_of_measurement="°C"))),
        BinarySensor(Settings(mqtt=mqtt_settings, entity=BinarySensorInfo(name="Motion", unique_id="porch-motion",
                                                                          device=device, device_class="motion"),
                              manual_availability=True)),
    ]
    for entity in entities:
        entity.write_config()
    configs = {}
    for topic, payload, retain in client.published:
        assert retain
        configs[topic.split("/")[1]] = (topic, payload)
    return configs


def test_configs_published_by_ha_mqtt_discoverable() -> None:
    configs = _hmd_configs()
    assert set(configs) == {"light", "lock", "valve", "switch", "number", "select", "sensor", "binary_sensor"}
    catalog = Catalog()
    for topic, payload in configs.values():
        catalog.update(topic, payload)
    [porch] = catalog.devices()
    assert porch.key == DeviceKey("ha:Porch", "porch-01") and not porch.left_out
    assert porch.device == DeviceInfo("Porch", "Acme", "P1", "0.3")
    by_kind = {c.component: c for c in porch.components}
    light = by_kind["light"]
    assert light.object_id == "Lamp" and light.discovery_topic == "homeassistant/light/Porch/Lamp/config"
    assert light.config["schema"] == "json" and light.config["brightness"] is True
    assert light.config["command_topic"] == "hmd/light/Porch/Lamp/command"
    assert light.config["state_topic"] == "hmd/light/Porch/Lamp/state"
    lock = by_kind["lock"]
    assert (lock.config["payload_lock"], lock.config["state_locked"]) == ("LOCK", "LOCKED")
    assert by_kind["valve"].config["reports_position"] is False
    assert (by_kind["number"].config["min"], by_kind["number"].config["max"]) == (0, 10)
    assert by_kind["select"].config["options"] == ["day", "night"]
    assert by_kind["sensor"].config["unit_of_measurement"] == "°C"
    assert availability(by_kind["binary_sensor"].config).topics == (
        AvailabilityTopic("hmd/binary_sensor/Porch/Motion/availability"),)


# ---------------------------------------------------------------------------------------------------------------
# Hostile input: nothing raises, whatever the topic and payload.

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from([*list(ABBREVIATIONS)[:40], "~", "dev", "o", "cmps", "p", "avty", "t", "ids", "cns",
                         "cmd_t", "stat_t", "avty_t", "name", "platform"]) | st.text(max_size=8), inner, max_size=6),
    max_leaves=30)
_TOPICS = st.sampled_from(["homeassistant/switch/n/o/config", "homeassistant/device/d/config",
                           "homeassistant/light/o/config", "homeassistant/device/n/d/config",
                           "homeassistant/button/o/config"])


@settings(max_examples=250, deadline=None)
@given(_TOPICS, _JSON)
def test_any_json_is_read_or_left_out(topic: str, data: object) -> None:
    reading = read_config(topic, json.dumps(data).encode())
    for component in reading.components:
        assert isinstance(component.config, dict) and "~" not in component.config
        availability(component.config)
    catalog = Catalog()
    catalog.update(topic, json.dumps(data).encode())
    catalog.devices()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_TOPICS, _JSON | st.just("")), max_size=6))
def test_the_catalog_agrees_with_a_fresh_grouping(messages: list[tuple[str, object]]) -> None:
    catalog = Catalog()
    for topic, data in messages:
        catalog.update(topic, json.dumps(data).encode() if data != "" else b"")
    everything = catalog.devices()
    for found in everything:
        assert catalog.device(found.key) == found
    for topic, _ in messages:
        for key in catalog.update(topic, b""):
            assert catalog.device(key) is None or any(key == d.key for d in catalog.devices())
    assert catalog.devices() == [] and catalog.readings == {}


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.binary(max_size=200))
def test_any_bytes_on_any_topic(topic: str, payload: bytes) -> None:
    assert isinstance(read_config(topic, payload), Reading)
    assert isinstance(read_config("homeassistant/device/d/config", payload), Reading)
