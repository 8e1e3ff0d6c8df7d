"""Home Assistant MQTT devices for the bridge tests: real discovery configurations, responders that behave as the
Home Assistant MQTT documents say.

Light, lock, valve and sensor are made with the third-party library `ha-mqtt-discoverable` (PyPI, pinned): it
publishes the retained discovery configuration, its own state topics and command topic, exactly as it does for a
user. Each responder applies a command from its command topic and publishes the new state (not retained), as the
Home Assistant docs describe a device in non-optimistic mode (light.mqtt, JSON schema; lock.mqtt; valve.mqtt).
The library has no fan and no climate: `DocumentedDevice` publishes Home Assistant's documented example
configurations for those (fan.mqtt "Full configuration", climate.mqtt target temperature) and answers the same way.

Each device is one source with its own broker account: its username is its MQTT client id (Corral's broker pins
client ids to usernames), its discovery node id is its name, and its state topics live under its own root
(`state_prefix`), so the broker lets only that account publish them.

A responder can be told to stay silent (`mute`): it still counts the commands it receives but publishes no state,
like a device that lost its radio link after taking the command off the broker.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from ha_mqtt_discoverable import DeviceInfo, Settings
from ha_mqtt_discoverable.sensors import (
    Light,
    LightInfo,
    Lock,
    LockInfo,
    Sensor,
    SensorInfo,
    Valve,
    ValveInfo,
)


@dataclass(frozen=True)
class SourceAccount:
    """A bridged source's broker account: what `corral bridge add-source` made."""

    username: str
    password: str
    node: str  # its discovery node id (the device name, as ha-mqtt-discoverable makes the topic)
    root: str  # the root of its state and command topics (ha-mqtt-discoverable's state_prefix)


@dataclass
class Responder:
    """What a responder received and did."""

    name: str
    commands: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    mute: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self, payload: str) -> bool:
        """Count the command; whether to answer it."""
        with self.lock:
            self.commands.append(payload)
            return not self.mute


def _settings(source: SourceAccount, port: int, entity: Any) -> Settings[Any]:
    mqtt_settings = Settings.MQTT(host="127.0.0.1", port=port, username=source.username, password=source.password,
                                  client_name=source.username, state_prefix=source.root)
    return Settings(mqtt=mqtt_settings, entity=entity)


def _device(source: SourceAccount, model: str) -> DeviceInfo:
    return DeviceInfo(name=source.node, identifiers=[f"{source.node}-id"], manufacturer="ha-mqtt-discoverable",
                      model=model, sw_version="1.0.0")


class HaLight:
    """A dimmable light (JSON schema, brightness 0-255), as ha-mqtt-discoverable announces it."""

    def __init__(self, source: SourceAccount, port: int, brightness_scale: int | None = None) -> None:
        self.responder = Responder(source.node)
        self.source = source
        info = LightInfo(name="lamp", unique_id=f"{source.node}-lamp", device=_device(source, "Dimmable lamp"),
                         brightness=True, color_mode=True, supported_color_modes=["brightness"])
        self.entity = Light(_settings(source, port, info), self._command)
        self.entity.write_config()
        self.entity.off()
        self.responder.state = {"state": "OFF"}
        self._scale = brightness_scale

    def _command(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        payload = message.payload.decode()
        if not self.responder.received(payload):
            return
        command = json.loads(payload)  # {"state": "ON", "brightness": 128} (light.mqtt, JSON schema)
        if command.get("state") == "OFF":
            self.responder.state = {"state": "OFF"}
            self.entity.off()
        elif "brightness" in command:
            self.responder.state = {"state": "ON", "brightness": int(command["brightness"])}
            self.entity.brightness(int(command["brightness"]))
        else:
            self.responder.state = {**self.responder.state, "state": "ON"}
            self.entity.on()

    def announce(self, **extra: Any) -> None:
        """Publish the discovery configuration again, changed (e.g. brightness_scale=1000: a wider range)."""
        config = {**self.entity.generate_config(), **extra}
        self.entity.mqtt_client.publish(self.entity.config_topic, json.dumps(config), retain=True).wait_for_publish(5)

    @property
    def command_topic(self) -> str:
        return str(self.entity._command_topic)

    @property
    def state_topic(self) -> str:
        return self.entity.state_topic

    def close(self) -> None:
        _close(self.entity)


class HaLock:
    def __init__(self, source: SourceAccount, port: int) -> None:
        self.responder = Responder(source.node)
        info = LockInfo(name="bolt", unique_id=f"{source.node}-bolt", device=_device(source, "Door lock"))
        self.entity = Lock(_settings(source, port, info), self._command)
        self.entity.write_config()
        self.entity.unlocked()
        self.responder.state = {"state": "UNLOCKED"}

    def _command(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        payload = message.payload.decode()
        if not self.responder.received(payload):
            return
        if payload == "LOCK":  # lock.mqtt: payload_lock / payload_unlock; the state is state_locked / _unlocked
            self.responder.state = {"state": "LOCKED"}
            self.entity.locked()
        elif payload == "UNLOCK":
            self.responder.state = {"state": "UNLOCKED"}
            self.entity.unlocked()

    @property
    def command_topic(self) -> str:
        return str(self.entity._command_topic)

    def close(self) -> None:
        _close(self.entity)


class HaValve:
    def __init__(self, source: SourceAccount, port: int) -> None:
        self.responder = Responder(source.node)
        info = ValveInfo(name="water", unique_id=f"{source.node}-water", device=_device(source, "Water valve"),
                         device_class="water")
        self.entity = Valve(_settings(source, port, info), self._command)
        self.entity.write_config()
        self.entity.closed()
        self.responder.state = {"state": "closed"}

    def _command(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        payload = message.payload.decode()
        if not self.responder.received(payload):
            return
        if payload == "OPEN":  # valve.mqtt: payload_open / payload_close; the state is state_open / state_closed
            self.responder.state = {"state": "open"}
            self.entity.open()
        elif payload == "CLOSE":
            self.responder.state = {"state": "closed"}
            self.entity.closed()

    @property
    def command_topic(self) -> str:
        return str(self.entity._command_topic)

    @property
    def state_topic(self) -> str:
        return self.entity.state_topic

    def close(self) -> None:
        _close(self.entity)


class HaSensor:
    def __init__(self, source: SourceAccount, port: int) -> None:
        info = SensorInfo(name="temperature", unique_id=f"{source.node}-temperature",
                          device=_device(source, "Thermometer"), device_class="temperature",
                          unit_of_measurement="°C")
        self.entity = Sensor(_settings(source, port, info))
        self.entity.write_config()

    def publish(self, value: float) -> None:
        self.entity.set_state(value)

    def close(self) -> None:
        _close(self.entity)


EXAMPLES = Path(__file__).resolve().parent / "data" / "bridge" / "ha" / "examples.json"


class DocumentedDevice:
    """A fan or a climate device announcing Home Assistant's documented example configuration (fan.mqtt "Full
    configuration" with presets; climate.mqtt with target temperature and modes, abbreviated keys; as kept in
    tests/data/bridge/ha/examples.json), moved under its source's node id and topic root. It answers as the docs
    describe a non-optimistic device: a command on a `*_command_topic` is applied and the new state published on the
    matching state topic (the climate's shared JSON state topic with `mode`, `target_temp` and `current_temp`)."""

    def __init__(self, source: SourceAccount, port: int, example: str) -> None:
        self.responder = Responder(source.node)
        documented = json.loads(EXAMPLES.read_text())[example]
        old_root = {"fan_presets": "bedroom_fan", "climate_abbreviated": "homeassistant/climate/livingroom"}[example]
        text = json.dumps(documented["payload"]).replace(f'"{old_root}/', f'"{source.root}/')
        self.config: dict[str, Any] = json.loads(text)
        self.config["unique_id"] = f"{source.node}-{example}"
        self.config["device"] = {"identifiers": [f"{source.node}-id"], "name": source.node,
                                 "manufacturer": "Home Assistant docs", "model": example, "sw_version": "1.0.0"}
        component = documented["topic"].split("/")[1]
        self.discovery_topic = f"homeassistant/{component}/{source.node}/{example}/config"
        self.example = example
        self.root = source.root
        # command topic -> the state topic that shows it (fan), or the climate's JSON field
        self.commands = self._commands()
        self.state: dict[str, Any] = {"mode": "off", "target_temp": 20.0, "current_temp": 19.5}
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=source.username)
        self.client.username_pw_set(source.username, source.password)
        self.client.on_connect = lambda client, *_: (self.resubscribe(), self.resend())  # as a device on connect
        self.client.on_message = self._command
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.publish(self.discovery_topic, json.dumps(self.config), qos=1, retain=True).wait_for_publish(5)

    def _commands(self) -> dict[str, str]:
        config = self.config
        if self.example == "fan_presets":
            return {config[f"{kind}_command_topic"]: config[f"{kind}_state_topic"]
                    for kind in ("preset_mode", "percentage", "oscillation", "direction")
                    if f"{kind}_command_topic" in config} | {config["command_topic"]: config["state_topic"]}
        return {config["mode_cmd_t"]: "mode", config["temp_cmd_t"]: "target_temp"}

    def resubscribe(self) -> None:
        self.client.subscribe([(topic, 1) for topic in self.commands])

    def resend(self) -> None:
        """Availability and state, as the device publishes them (dropped by the broker before its acceptance)."""
        if self.example == "climate_abbreviated":
            self.client.publish(self.config["avty_t"], "online", qos=1, retain=True)
            self.client.publish(self.config["temp_stat_t"], json.dumps(self.state), qos=1)

    def _command(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        payload = message.payload.decode()
        if not self.responder.received(payload):
            return
        target = self.commands.get(message.topic)
        if target is None:
            return
        if self.example == "fan_presets":
            self.responder.state[target] = payload
            self.client.publish(target, payload, qos=1)
            return
        self.state[target] = float(payload) if target == "target_temp" else payload
        self.responder.state = dict(self.state)
        self.client.publish(self.config["temp_stat_t"], json.dumps(self.state), qos=1)

    @property
    def command_topic(self) -> str:
        return next(iter(self.commands))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _close(entity: Any) -> None:
    client: mqtt.Client = entity.mqtt_client
    client.disconnect()
    client.loop_stop()
