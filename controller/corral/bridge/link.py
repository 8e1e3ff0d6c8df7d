"""The bridge's MQTT connections: one main link, and one presence connection per accepted bridged device.

paho runs its network loop in its own thread; as in devices/link.py, every callback crosses into the asyncio loop
with `call_soon_threadsafe` and nothing else runs on paho's thread. Each inbound message is stamped with the
monotonic time it arrived, on paho's thread, so a state that arrived before a command was published cannot pass
for its confirmation just because it waited in the queue (bridge/confirm.py).

Presence: MQTT gives a connection exactly one Last Will, and the bridge's death must make *every* device it speaks
for offline. So each accepted device has a small connection of its own, as the presence account
`<bridge account>.<device id>` (the bridge's password; client id = username, devices/bridge_accounts.py)
whose Will is the retained `offline` on `iot/<id>/status`; it publishes that device's `online`/`offline` and
nothing else. A clean stop publishes `offline` for each before it disconnects (the broker discards a Will on a
normal DISCONNECT).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from corral.devices.link import BrokerAddress, TlsFiles

log = logging.getLogger(__name__)

RETRY_S = 1.0  # a refused subscription or retained publish is tried again after this long (at first)
MAX_RETRY_S = 30.0


@dataclass(frozen=True)
class Arrived:
    topic: str
    payload: bytes
    retained: bool
    at: float  # time.monotonic() on paho's thread, when the message came in


def _client(address: BrokerAddress, tls: TlsFiles, client_id: str) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    if address.username is not None:
        client.username_pw_set(address.username, address.password)
    if address.tls:
        client.tls_set_context(tls.context())
    client.reconnect_delay_set(min_delay=1, max_delay=30)
    return client


class BridgeLink:
    """The main connection: discovery, device state, `iot/<id>/cmd` in; contracts, acks, telemetry and device
    commands out. Subscriptions change as devices are accepted; they are made again on every connect."""

    def __init__(self, address: BrokerAddress, on_message: Callable[[Arrived], None],
                 on_connected: Callable[[], None] = lambda: None, tls: TlsFiles | None = None) -> None:
        self.address = address
        self.tls = tls or TlsFiles()
        self._on_message = on_message
        self._on_connected = on_connected
        self._subscriptions: set[str] = set()
        # The broker grants a device's topics when the controller sees its Device, which may be just after the
        # bridge does: a refused subscription or retained publish (MQTT 5 reason 0x87) is tried again.
        self._asked: dict[int, list[str]] = {}  # subscribe mid -> its topics
        self._backoff: dict[str, float] = {}  # a refused topic -> how long to wait before its next try
        self._retained: dict[int, tuple[str, bytes | str]] = {}  # publish mid -> (topic, payload), until acked
        self._latest: dict[str, bytes | str] = {}  # topic -> the retained payload last published there
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: mqtt.Client | None = None
        self.connected = asyncio.Event()

    @property
    def client_id(self) -> str:
        return self.address.username or "corral-bridge"

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        client = _client(self.address, self.tls, self.client_id)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        client.on_subscribe = self._handle_subscribe
        client.on_publish = self._handle_publish
        self._client = client
        client.connect_async(self.address.host, self.address.port, keepalive=30)
        client.loop_start()

    async def stop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(lambda: (client.disconnect(), client.loop_stop()))
        self.connected.clear()

    def subscribe(self, topics: Iterable[str]) -> None:
        new = [topic for topic in topics if topic not in self._subscriptions]
        self._subscriptions.update(new)
        self._subscribe(new)

    def _subscribe(self, topics: list[str]) -> None:
        if topics and self._client is not None and self.connected.is_set():
            _, mid = self._client.subscribe([(topic, 1) for topic in topics])
            if mid is not None:
                self._asked[mid] = topics

    def forget(self, topic: str) -> None:
        """Stop trying again to publish a retained message on `topic` (its device is no longer bridged)."""
        self._latest.pop(topic, None)

    def unsubscribe(self, topics: Iterable[str]) -> None:
        gone = [topic for topic in topics if topic in self._subscriptions]
        self._subscriptions.difference_update(gone)
        if gone and self._client is not None and self.connected.is_set():
            self._client.unsubscribe(gone)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False) -> None:
        if self._client is None:
            raise RuntimeError("the bridge's MQTT link is not started")
        sent = self._client.publish(topic, payload, qos=qos, retain=retain)
        if retain and qos > 0:
            self._retained[sent.mid] = (topic, payload)
            self._latest[topic] = payload

    # paho thread ---------------------------------------------------------------------------

    def _handle_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        if reason.is_failure:
            log.warning("the broker refused the bridge's connection: %s", reason)
            return
        self._call_soon(self._mark_connected)

    def _handle_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        log.warning("the bridge's MQTT link is down (%s); reconnecting", reason)
        self._call_soon(self.connected.clear)

    def _handle_subscribe(self, _c: mqtt.Client, _u: Any, mid: int, codes: list[ReasonCode], _p: Any) -> None:
        self._call_soon(self._subscribed, mid, [code.is_failure for code in codes])

    def _handle_publish(self, _c: mqtt.Client, _u: Any, mid: int, code: ReasonCode, _p: Any) -> None:
        self._call_soon(self._published, mid, code.is_failure)

    def _handle_message(self, _c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        self._call_soon(self._deliver, Arrived(message.topic, bytes(message.payload), bool(message.retain),
                                               time.monotonic()))

    def _call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(callback, *args)

    # asyncio loop ---------------------------------------------------------------------------

    def _mark_connected(self) -> None:
        self.connected.set()
        self._asked.clear()
        self._subscribe(sorted(self._subscriptions))  # a clean session: subscribe again every time
        self._on_connected()

    def _subscribed(self, mid: int, failed: list[bool]) -> None:
        topics = self._asked.pop(mid, [])
        refused = [topic for topic, no in zip(topics, failed, strict=False) if no and topic in self._subscriptions]
        for topic, no in zip(topics, failed, strict=False):
            if not no:
                self._backoff.pop(topic, None)
        if refused and self._loop is not None:
            # Soon at first (a grant on its way), then less and less often (a topic the account will never have).
            delay = max(self._backoff.get(topic, RETRY_S) for topic in refused)
            for topic in refused:
                self._backoff[topic] = min(delay * 2, MAX_RETRY_S)
            log.info("the broker refused the subscription to %s for now; trying again in %g s", ", ".join(refused),
                     delay)
            self._loop.call_later(delay, lambda: self._subscribe(
                [topic for topic in refused if topic in self._subscriptions]))

    def _published(self, mid: int, failed: bool) -> None:
        entry = self._retained.pop(mid, None)
        if entry is not None and failed and self._loop is not None:
            topic, payload = entry
            log.info("the broker refused the retained message on %s for now; trying again", topic)
            self._loop.call_later(RETRY_S, self._again, topic, payload)

    def _again(self, topic: str, payload: bytes | str) -> None:
        # Only the latest payload for the topic, and only while it is still wanted.
        if self._client is not None and self._latest.get(topic) == payload:
            self.publish(topic, payload, retain=True)

    def _deliver(self, message: Arrived) -> None:
        try:
            self._on_message(message)
        except Exception:  # one bad message must not stop the others
            log.exception("handling the MQTT message on %s failed", message.topic)


class Presence:
    """One device's `iot/<id>/status`, on a connection of its own whose Will says `offline` (retained)."""

    def __init__(self, address: BrokerAddress, tls: TlsFiles, username: str, status_topic: str) -> None:
        self.status_topic = status_topic
        self._online = False
        client = _client(replace(address, username=username), tls, username)
        client.will_set(status_topic, "offline", qos=1, retain=True)
        client.on_connect = self._handle_connect
        self._client = client
        client.connect_async(address.host, address.port, keepalive=15)
        client.loop_start()

    def set(self, online: bool) -> None:
        """Publish `online`/`offline` now if connected; a (re)connect publishes the latest again."""
        self._online = online
        if self._client.is_connected():
            self._client.publish(self.status_topic, "online" if online else "offline", qos=1, retain=True)

    def _handle_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        if not reason.is_failure:
            client.publish(self.status_topic, "online" if self._online else "offline", qos=1, retain=True)

    def close(self) -> None:
        """Say `offline` ourselves, then disconnect (blocking: call it in a thread)."""
        if self._client.is_connected():
            sent = self._client.publish(self.status_topic, "offline", qos=1, retain=True)
            try:
                sent.wait_for_publish(timeout=2.0)
            except (RuntimeError, ValueError):
                log.warning("could not publish offline on %s before disconnecting", self.status_topic)
        self._client.disconnect()
        self._client.loop_stop()
