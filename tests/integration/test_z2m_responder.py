"""The zigbee2mqtt responder (tests/z2m_harness.py) on a real Mosquitto with accounts: what it publishes is what
exposes.py reads, and it answers the commands the components describe as zigbee2mqtt would (optimistic echo, then
the device's own clamped report; silent, echo-only and retained devices)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from corral.bridge.exposes import read_devices
from tests import z2m_devices
from tests.broker_harness import OwnBroker, connected, observer, own_broker
from tests.harness import wait_for
from tests.z2m_harness import Z2mResponder, z2m_responder

BASE = "z2m-test"


class Listener:
    """Everything under the base topic, with the retain flag as delivered."""

    def __init__(self, broker: OwnBroker) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self._lock = threading.Lock()
        self.client = connected(broker, *observer(broker, "z2m-listener"))
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.subscribe(f"{BASE}/#", qos=1)
        assert subscribed.wait(10)

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((message.topic, bytes(message.payload), bool(message.retain)))

    def on(self, topic: str, retained: bool | None = None) -> list[dict[str, object]]:
        with self._lock:
            return [json.loads(p) for t, p, r in self.messages if t == topic and (retained is None or r == retained)]

    def send(self, topic: str, payload: str) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(5)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnBroker]:
    with own_broker(Path(tmp_path_factory.mktemp("z2m-broker"))) as running:
        yield running


@pytest.fixture(scope="module")
def z2m(broker: OwnBroker) -> Iterator[Z2mResponder]:
    with z2m_responder(broker, observer(broker, "z2m"), z2m_devices.bridge_devices(), base_topic=BASE,
                       report_delay_s=0.1) as responder:
        yield responder


@pytest.fixture
def listener(broker: OwnBroker, z2m: Z2mResponder) -> Iterator[Listener]:
    heard = Listener(broker)
    yield heard
    heard.client.disconnect()
    heard.client.loop_stop()


def test_what_it_announces_is_what_exposes_reads(listener: Listener) -> None:
    devices = wait_for(lambda: listener.on(f"{BASE}/bridge/devices", retained=True), "the retained device list")
    found = read_devices(json.dumps(devices[0]).encode(), BASE)
    assert {d.device.name for d in found} == set(z2m_devices.MODELS)
    assert wait_for(lambda: listener.on(f"{BASE}/bridge/state", retained=True), "bridge/state") == [
        {"state": "online"}]
    assert listener.on(f"{BASE}/bulb/availability", retained=True) == [{"state": "online"}]


def test_a_light_command_is_echoed_then_reported_clamped(z2m: Z2mResponder, listener: Listener) -> None:
    (bulb,) = [d for d in read_devices(json.dumps(z2m.devices).encode(), BASE) if d.device.name == "bulb"]
    (light,) = [c for c in bulb.components if c.component == "light"]
    before = len(z2m.sets_for("bulb"))
    listener.send(light.config["command_topic"], json.dumps({"state": "ON", "brightness": 300, "color_temp": 300}))
    wait_for(lambda: len(listener.on(light.config["state_topic"])) >= 2, "the echo and the report")
    states = listener.on(light.config["state_topic"])
    echo, report = states

    assert (echo["state"], echo["brightness"]) == ("ON", 300)  # the request, as zigbee2mqtt echoes it
    assert (report["state"], report["brightness"]) == ("ON", 254)  # the device clamps to its value_max
    assert len(z2m.sets_for("bulb")) == before + 1
    assert z2m.state("bulb")["brightness"] == 254


def roundtrip(z2m: Z2mResponder, listener: Listener, friendly: str, subtopic: str, payload: str) -> dict[str, Any]:
    """Send a command and wait for zigbee2mqtt's echo and the device's report; the state reported."""
    topic = f"{BASE}/{friendly}"
    before = sum(1 for t, _, _ in z2m.published if t == topic)
    listener.send(f"{topic}/{subtopic}", payload)
    wait_for(lambda: sum(1 for t, _, _ in z2m.published if t == topic) >= before + 2, f"{friendly}'s echo and report")
    return z2m.state(friendly)


def test_bare_payloads_attributes_and_invalid_values(z2m: Z2mResponder, listener: Listener) -> None:
    assert roundtrip(z2m, listener, "plug", "set", "ON")["state"] == "ON"
    assert roundtrip(z2m, listener, "radiator", "set/occupied_heating_setpoint", "21.5")[
        "occupied_heating_setpoint"] == 21.5
    assert roundtrip(z2m, listener, "front_door", "set", json.dumps({"state": "UNLOCK"}))["lock_state"] == "unlocked"
    blind = roundtrip(z2m, listener, "blind", "set", json.dumps({"position": 40}))
    assert (blind["position"], blind["state"]) == (40, "OPEN")
    assert roundtrip(z2m, listener, "blind", "set", "CLOSE")["position"] == 0
    count, sets = len(z2m.published), len(z2m.sets_for("radiator"))
    listener.send(f"{BASE}/radiator/set/keypad_lockout", "sideways")  # not one of its values
    listener.send(f"{BASE}/radiator/set/pi_heating_demand", "50")  # published, not settable
    listener.send(f"{BASE}/radiator/set", "not json")
    z2m.wait_for_sets("radiator", sets + 3)
    assert roundtrip(z2m, listener, "plug", "set", "OFF")["state"] == "OFF"  # later: the above published nothing
    assert [t for t, _, _ in z2m.published[count:]] == [f"{BASE}/plug", f"{BASE}/plug"]


def test_silent_and_echo_only_devices(z2m: Z2mResponder, listener: Listener) -> None:
    topic = f"{BASE}/hallway_climate"
    roundtrip(z2m, listener, "plug", "set", "OFF")
    z2m.behave("plug", "silent")
    try:
        count, sets = len(z2m.published), len(z2m.sets_for("plug"))
        listener.send(f"{BASE}/plug/set", "ON")
        z2m.wait_for_sets("plug", sets + 1)
        z2m.report("hallway_climate", temperature=19.5)
        assert [t for t, _, _ in z2m.published[count:]] == [topic]
        assert z2m.state("plug")["state"] == "OFF"
        z2m.behave("plug", "echo_only")
        listener.send(f"{BASE}/plug/set", "ON")
        wait_for(lambda: z2m.state("plug")["state"] == "ON", "the echo")
        assert z2m.pending_reports() == 0  # no report is on its way
        z2m.report("hallway_climate", temperature=19.0)
        assert [t for t, _, _ in z2m.published[count:]] == [topic, f"{BASE}/plug", topic]
    finally:
        z2m.behave("plug", "report")


def test_a_retained_device_state_is_kept_by_the_broker(broker: OwnBroker, z2m: Z2mResponder) -> None:
    topic = f"{BASE}/hallway_climate"
    z2m.retain("hallway_climate")
    try:
        z2m.report("hallway_climate", temperature=18.0)
        assert z2m.published[-1] == (topic, z2m.state("hallway_climate"), True)
        later = Listener(broker)  # subscribes after the publish: only a retained message reaches it
        try:
            kept = wait_for(lambda: later.on(topic, retained=True), "the retained state")
            assert kept[-1]["temperature"] == 18.0
        finally:
            later.client.disconnect()
            later.client.loop_stop()
    finally:
        z2m.retain("hallway_climate", False)
        z2m.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)  # clear what the broker kept
