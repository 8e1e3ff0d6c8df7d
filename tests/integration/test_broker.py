"""The broker is a real Mosquitto: publish/subscribe, retained messages and Last Will, as devices will use them.

Every client here is a broker account that may use every topic (tests/broker_harness.py); what the
accounts of enrolled devices may not do is tests/integration/test_device_trust.py."""

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from corral.devcluster.files import MAX_PACKET_SIZE
from corral.devcluster.plane import Plane
from corral_sim.catalog import contract_for, device_types
from tests.broker_harness import observer

pytestmark = pytest.mark.integration


def _connected(plane: Plane, name: str, will: tuple[str, bytes] | None = None) -> mqtt.Client:
    username, password = observer(plane, name)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)
    if will is not None:
        client.will_set(will[0], will[1], qos=1, retain=True)
    client.connect("127.0.0.1", plane.mqtt_port, keepalive=5)
    client.loop_start()
    return client


def _inbox(client: mqtt.Client, topic: str) -> queue.Queue[mqtt.MQTTMessage]:
    received: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    subscribed = queue.Queue[int]()
    client.on_message = lambda _c, _u, message: received.put(message)
    client.on_subscribe = lambda _c, _u, mid, _codes, _p: subscribed.put(mid)
    _, mid = client.subscribe(topic, qos=1)
    assert subscribed.get(timeout=5) == mid
    return received


@pytest.fixture
def prefix() -> Iterator[str]:
    yield f"test-{uuid.uuid4().hex[:8]}"


def test_publish_subscribe_round_trip(plane: Plane, prefix: str) -> None:
    subscriber = _connected(plane, "sub")
    publisher = _connected(plane, "pub")
    try:
        inbox = _inbox(subscriber, f"{prefix}/+/cmd")
        publisher.publish(f"{prefix}/dev1/cmd", b'{"id": "c-1", "cmd": "set_level"}', qos=1).wait_for_publish(5)
        message = inbox.get(timeout=5)
        assert message.topic == f"{prefix}/dev1/cmd"
        assert message.payload == b'{"id": "c-1", "cmd": "set_level"}'
    finally:
        for c in (subscriber, publisher):
            c.loop_stop()
            c.disconnect()


def test_retained_message_reaches_a_late_subscriber(plane: Plane, prefix: str) -> None:
    device = _connected(plane, "device")
    device.publish(f"{prefix}/dev1/info", b'{"device_id": "dev1"}', qos=1, retain=True).wait_for_publish(5)
    device.loop_stop()
    device.disconnect()

    late = _connected(plane, "late")
    try:
        message = _inbox(late, f"{prefix}/+/info").get(timeout=5)
        assert message.retain and message.payload == b'{"device_id": "dev1"}'
    finally:
        late.loop_stop()
        late.disconnect()


def test_last_will_is_published_when_a_device_vanishes(plane: Plane, prefix: str) -> None:
    watcher = _connected(plane, "watcher")
    device = _connected(plane, "device", will=(f"{prefix}/dev1/status", b"offline"))
    try:
        inbox = _inbox(watcher, f"{prefix}/dev1/status")
        # Drop the TCP connection without DISCONNECT, as a device losing power would.
        device.loop_stop()
        device.socket().close()
        message = inbox.get(timeout=15)
        assert message.payload == b"offline"
    finally:
        watcher.loop_stop()
        watcher.disconnect()


def test_a_packet_over_the_brokers_limit_disconnects_its_sender_while_the_largest_contract_passes(
        plane: Plane, prefix: str) -> None:
    """max_packet_size (devcluster.files.MAX_PACKET_SIZE, 256 KiB): a device cannot make the broker take a
    packet bigger than any contract needs. The catalog's largest contract, padded to 64 KiB (the most the
    controller reads), still passes."""
    largest = max((contract_for(t) for t in device_types()), key=lambda c: len(json.dumps(c)))
    contract = json.dumps({**largest, "device_id": "dev1", "padding": "x" * (64 * 1024 - len(json.dumps(largest))
                                                                             - 40)}).encode()
    subscriber = _connected(plane, "sub")
    sender = _connected(plane, "big")
    gone = queue.Queue[object]()
    sender.on_disconnect = lambda _c, _u, _f, reason, _p: gone.put(reason)
    try:
        inbox = _inbox(subscriber, f"{prefix}/+/info")
        sender.publish(f"{prefix}/dev1/info", contract, qos=1).wait_for_publish(5)
        assert inbox.get(timeout=5).payload == contract
        assert gone.empty()
        sender.publish(f"{prefix}/dev1/info", b"x" * (MAX_PACKET_SIZE + 1), qos=1)
        assert gone.get(timeout=5) is not None, "the broker cut the sender off"
        subscriber.publish(f"{prefix}/dev2/info", b"after", qos=1).wait_for_publish(5)
        assert inbox.get(timeout=5).payload == b"after", "nothing of the oversized packet reached anyone"
    finally:
        for c in (subscriber, sender):
            c.loop_stop()
            c.disconnect()
