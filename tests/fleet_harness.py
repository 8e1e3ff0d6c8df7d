"""Shared helpers for tests with simulated devices on the real broker: a watching MQTT client, a running fleet.

The fleet runs the real firmware (one MQTT connection per device) on a thread
of its own; `on_fleet` runs code on that thread, where the firmware lives.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import paho.mqtt.client as mqtt

from corral.client.enroll import enroll
from corral.devcluster.plane import Plane
from corral_sim.fleet import Broker, DeviceSpec, Fleet, FleetOptions
from tests.broker_harness import Broker as TestBroker
from tests.broker_harness import device_accounts, observer

T = TypeVar("T")


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    retain: bool
    at: float

    @property
    def kind(self) -> str:
        return self.topic.rsplit("/", 1)[1]

    @property
    def device_id(self) -> str:
        return self.topic.split("/")[-2]

    def json(self) -> Any:
        return json.loads(self.payload)


class Watcher:
    """An MQTT client that records everything under a prefix and sends commands."""

    def __init__(self, plane: Plane, prefix: str, name: str = "watcher") -> None:
        self.prefix = prefix
        self._messages: list[Message] = []
        self._changed = threading.Condition()
        subscribed = threading.Event()
        username, password = observer(plane, name)
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv311)
        self.client.username_pw_set(username, password)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect("127.0.0.1", plane.mqtt_port, keepalive=10)
        self.client.loop_start()
        self.client.subscribe(f"{prefix}/#", qos=1)
        assert subscribed.wait(5), "the watcher could not subscribe"

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._changed:
            self._messages.append(Message(message.topic, message.payload, bool(message.retain), time.monotonic()))
            self._changed.notify_all()

    def messages(self, device_id: str | None = None, kind: str | None = None) -> list[Message]:
        with self._changed:
            return [
                m for m in self._messages
                if (device_id is None or m.device_id == device_id) and (kind is None or m.kind == kind)
            ]

    def wait_for(self, what: str, probe: Callable[[], T], timeout_s: float = 8.0) -> T:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                result = probe()
                if result:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    kinds = [(m.device_id, m.kind, m.payload[:80]) for m in self._messages[-10:]]
                    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last messages: {kinds}")
                self._changed.wait(min(remaining, 0.2))

    def wait_count(self, device_id: str, kind: str, count: int, timeout_s: float = 8.0) -> list[Message]:
        def probe() -> list[Message] | None:
            found = self.messages(device_id, kind)
            return found if len(found) >= count else None

        return self.wait_for(f"{count} {kind} message(s) from {device_id}", probe, timeout_s)

    def wait_status(self, device_id: str, status: str, after: int = 0, timeout_s: float = 8.0) -> Message:
        def probe() -> Message | None:
            found = [m for m in self.messages(device_id, "status")[after:] if m.payload == status.encode()]
            return found[0] if found else None

        return self.wait_for(f"status {status} from {device_id}", probe, timeout_s)

    def send(self, device_id: str, command: dict[str, Any] | bytes) -> None:
        payload = command if isinstance(command, bytes) else json.dumps(command).encode()
        self.client.publish(f"{self.prefix}/{device_id}/cmd", payload, qos=1).wait_for_publish(5)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def retained(plane: Plane, topic: str, timeout_s: float = 5.0) -> Message:
    """What a client subscribing now gets as the retained message of topic."""
    got: list[Message] = []
    arrived = threading.Event()
    username, password = observer(plane, "late")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv311)
    client.username_pw_set(username, password)

    def on_message(_c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        got.append(Message(message.topic, message.payload, bool(message.retain), time.monotonic()))
        arrived.set()

    client.on_message = on_message
    client.connect("127.0.0.1", plane.mqtt_port, keepalive=10)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        assert arrived.wait(timeout_s), f"no retained message on {topic}"
        return got[0]
    finally:
        client.disconnect()
        client.loop_stop()


def enroll_devices(kube: Any, namespace: str, devices: dict[str, str]) -> dict[str, str]:
    """Enroll the devices (id -> type) as a person would: their Devices and credentials. id -> password."""
    return {device_id: enroll(kube, namespace, device_id, device_type).password
            for device_id, device_type in devices.items()}


@contextmanager
def running_fleet(plane: Plane, prefix: str, devices: dict[str, str], *, enroll_in: tuple[Any, str] | None = None,
                  credentials: dict[str, str] | None = None, tls: bool = False,
                  contracts: dict[str, dict[str, Any]] | None = None, **options: Any) -> Iterator[Fleet]:
    """devices: id -> type. Runs the fleet on a thread of its own until the block ends (then stops it cleanly).

    Every device connects with an account of its own. `enroll_in` (an admin client, a namespace): the devices
    are enrolled there first, as a person would (Devices and credentials, which the controller keeps the
    broker's accounts from); `credentials` (id -> password): they were enrolled already; neither (tests of the
    firmware alone, no controller on this prefix): they only get broker accounts. Either way the accounts are
    made at once, so the devices need not wait for a controller to make them. `tls`: over the plane's TLS
    listener, checked against its CA. `contracts` (id -> contract without device_id): firmware built with
    another contract than its type's catalog one (e.g. a shorter failsafe delay).
    """
    if enroll_in is not None:
        passwords = enroll_devices(enroll_in[0], enroll_in[1], devices)
    elif credentials is not None:
        passwords = dict(credentials)
    else:
        passwords = {device_id: secrets.token_urlsafe(16) for device_id in devices}
    device_accounts(plane, prefix, passwords)
    specs = [DeviceSpec(device_type, device_id) for device_id, device_type in devices.items()]
    settings = {"prefix": prefix, "reconnect_min_s": 0.2, "reconnect_max_s": 2.0, "connect_spread_s": 0.1,
                "auto_inputs": False, **options}
    broker = (Broker("127.0.0.1", plane.mqtt_tls_port, credentials=passwords, tls=True, ca_file=str(plane.mqtt_ca_file))
              if tls else Broker("127.0.0.1", plane.mqtt_port, credentials=passwords))
    fleet = Fleet(specs, broker, FleetOptions(**settings))
    for device_id, contract in (contracts or {}).items():
        fleet.devices[device_id].contract = contract
    thread = threading.Thread(target=fleet.run, name="fleet", daemon=True)
    thread.start()
    try:
        yield fleet
    finally:
        fleet.stop()
        thread.join(15)
        assert not thread.is_alive(), "the fleet did not stop"


def on_fleet(fleet: Fleet, fn: Callable[[], T]) -> T:
    """Run fn on the fleet's own thread and return its result."""
    result: Future[T] = Future()

    def call() -> None:
        try:
            result.set_result(fn())
        except Exception as err:  # noqa: BLE001 - handed to the test thread, which raises it
            result.set_exception(err)

    fleet.call_soon(call)
    return result.result(timeout=5)


def cmd(command_id: str, action: str, actuator: str | None = None, value: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if actuator is not None:
        params["actuator"] = actuator
    if value is not None:
        params["value"] = value
    return {"id": command_id, "cmd": action, "params": params}


def firmware(fleet: Fleet, device_id: str) -> Any:
    return on_fleet(fleet, lambda: fleet.devices[device_id].firmware)


def hardware_applies(fleet: Fleet, device_id: str) -> list[tuple[str, Any]]:
    """What the simulated hardware of a device was told to do (actuator, value), in order."""
    return on_fleet(fleet, lambda: [(a, v) for a, v, _units in fleet.devices[device_id].board.applied])


def hardware_applies_at(fleet: Fleet, device_id: str) -> list[tuple[str, Any, float]]:
    """hardware_applies with the time of each, in time.monotonic() seconds (the fleet's clock in this process)."""
    def read() -> list[tuple[str, Any, float]]:
        board = fleet.devices[device_id].board
        assert board is not None
        return [(a, v, at / 1000) for (a, v, _units), at in zip(board.applied, board.applied_ms, strict=True)]

    return on_fleet(fleet, read)


def publish(plane: TestBroker, messages: list[tuple[str, str | bytes, bool]]) -> None:
    """Publish (topic, payload, retain) messages with QoS 1 from a short-lived client that may use every
    topic (the test plays a device, or the broker's admin), and wait until sent."""
    username, password = observer(plane, "pub")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username)
    client.username_pw_set(username, password)
    client.connect("127.0.0.1", plane.mqtt_port)
    client.loop_start()
    try:
        for topic, payload, retain in messages:
            client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()


def announce(plane: Plane, prefix: str, device_id: str, info: dict[str, Any]) -> None:
    """What a device does on connect, from a test: retained info (any contract, valid or not) and online."""
    publish(plane, [(f"{prefix}/{device_id}/info", json.dumps(info), True),
                    (f"{prefix}/{device_id}/status", "online", True)])


THERMOMETER = {"name": "Thermometer", "model": "played-thermometer", "fw": "1.0.0",
               "sensors": [{"metric": "temperature", "unit": "°C", "range": {"min": -40, "max": 85}}]}


@contextmanager
def played_thermometers(plane: Plane, prefix: str, ids: list[str], value: Callable[[str, int], float],
                        enroll_in: tuple[Any, str] | None = None) -> Iterator[None]:
    """Sensor-only devices played from the test, with readings it chooses: each announces itself, sends
    `value(device_id, second)` at 1 Hz, and acks every command with its (empty) state, as firmware does
    (the controller reads a device's state before it writes its status). `enroll_in` as for running_fleet."""
    if enroll_in is not None:
        enroll_devices(enroll_in[0], enroll_in[1], dict.fromkeys(ids, "thermometer"))
    for device_id in ids:
        announce(plane, prefix, device_id, {**THERMOMETER, "device_id": device_id})
    stop = threading.Event()
    username, password = observer(plane, "played")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username)
    client.username_pw_set(username, password)

    def ack(_c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        command = json.loads(message.payload)
        client.publish(message.topic.rsplit("/", 1)[0] + "/ack",
                       json.dumps({"id": command.get("id"), "ok": True, "error": None, "state": {}}))

    def play() -> None:
        second = 0
        while not stop.is_set():
            now = int(time.time() * 1000)
            for device_id in ids:
                sample = {"metric": "temperature", "value": value(device_id, second), "ts": now}
                client.publish(f"{prefix}/{device_id}/telemetry", json.dumps({"ts": now, "samples": [sample]}))
            second += 1
            stop.wait(1.0)

    client.on_message = ack
    client.connect("127.0.0.1", plane.mqtt_port)
    client.loop_start()
    client.subscribe(f"{prefix}/+/cmd")
    player = threading.Thread(target=play, daemon=True)
    player.start()
    try:
        yield
    finally:
        stop.set()
        player.join(5)
        client.disconnect()
        client.loop_stop()
