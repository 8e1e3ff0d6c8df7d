"""The controller's one MQTT connection: connect, reconnect with backoff, resubscribe, publish commands.

paho-mqtt runs its network loop in its own thread. Every callback crosses into
the asyncio loop with `call_soon_threadsafe`, so nothing here blocks kopf's
event loop and no handler code ever runs on paho's thread.

With a `Heartbeat` (devices.heartbeat) the link also keeps the failsafe's clock going: a retained Will
`gone`, a retained `alive` and a first beat on every connect (from paho's thread, right after subscribing,
so they go out before any command), a beat every interval from a task on the loop, and a retained `gone`
before a clean stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlparse

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from corral.devices.heartbeat import Heartbeat
from corral.devices.topics import Topics
from corral.obs import metrics

log = logging.getLogger(__name__)

# Messages handed to on_message in one turn of the loop, at most.
DRAIN_BATCH = 500

# The broker refused MQTT 5 (v3.1.1 brokers answer "unacceptable protocol version").
_UNSUPPORTED_PROTOCOL = (1, 132)


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None = field(default=None, repr=False)  # never in a log line

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        parsed = urlparse(url)
        if parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname:
            shown = parsed._replace(netloc=parsed.netloc.rsplit("@", 1)[-1]).geturl()  # never repeat a password
            raise ValueError(f"MQTT URL must look like mqtt://host:1883 or mqtts://user@host:8883, got {shown!r}")
        tls = parsed.scheme == "mqtts"
        return cls(
            host=parsed.hostname,
            port=parsed.port or (8883 if tls else 1883),
            tls=tls,
            username=unquote(parsed.username) if parsed.username else None,
            password=unquote(parsed.password) if parsed.password else None,
        )


@dataclass(frozen=True)
class TlsFiles:
    """What `mqtts://` checks the broker with (a CA), and optionally the client's own certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True)
class Inbound:
    topic: str
    payload: bytes
    retained: bool


class MqttLink:
    def __init__(
        self,
        url: str,
        topics: Topics,
        on_message: Callable[[Inbound], None],
        on_connected: Callable[[], None] = lambda: None,
        client_id: str | None = None,
        extra_subscriptions: tuple[str, ...] = (),
        tls: TlsFiles | None = None,
        heartbeat: Heartbeat | None = None,
        password: str | None = None,
    ) -> None:
        """`password`: the account's, read from a file (`corral run --mqtt-password-file`); it wins over one in
        the URL, which only in-process callers (tests) may still use."""
        self.address = BrokerAddress.parse(url)
        if password is not None:
            self.address = replace(self.address, password=password)
        self.topics = topics
        self.extra_subscriptions = extra_subscriptions
        self.tls = tls or TlsFiles()
        self._on_message = on_message
        self._on_connected = on_connected
        self._client_id = client_id or f"corral-controller-{uuid.uuid4().hex[:8]}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: mqtt.Client | None = None
        self._protocol = mqtt.MQTTv5
        self.connected = asyncio.Event()
        self.reconnects = 0
        self._ever_connected = False
        self._restart_task: asyncio.Future[None] | None = None
        self._inbox: deque[Inbound] = deque()  # from paho's thread to the loop (_handle_message, _drain)
        self.heartbeat = heartbeat
        self._beating: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Begin connecting in the background; the link keeps retrying until stop()."""
        self._loop = asyncio.get_running_loop()
        self._client = self._new_client()
        self._client.connect_async(self.address.host, self.address.port, keepalive=30)
        self._client.loop_start()
        if self.heartbeat is not None:
            self._beating = asyncio.create_task(self._beat_forever(self.heartbeat), name="corral-heartbeat")

    async def stop(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
            self._beating = None
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(self._shutdown, client, self.heartbeat)
        self.connected.clear()

    @staticmethod
    def _shutdown(client: mqtt.Client, heartbeat: Heartbeat | None) -> None:
        if heartbeat is not None and client.is_connected():
            # A clean DISCONNECT discards the Will: say `gone` ourselves, so devices know why beats stop.
            sent = client.publish(heartbeat.topic, heartbeat.farewell(), qos=1, retain=True)
            try:
                sent.wait_for_publish(timeout=2.0)
            except (RuntimeError, ValueError):
                log.warning("could not publish the heartbeat's farewell before disconnecting")
        client.disconnect()
        client.loop_stop()

    async def _beat_forever(self, heartbeat: Heartbeat) -> None:
        """A beat every interval while connected (paho's publish only queues: this never blocks the loop)."""
        while True:
            await asyncio.sleep(heartbeat.interval_s)
            client = self._client
            if client is not None and self.connected.is_set():
                client.publish(heartbeat.topic, heartbeat.beat(), qos=0, retain=False)

    def publish(self, topic: str, payload: dict[str, Any], qos: int = 1,
                trace: dict[str, str] | None = None) -> mqtt.MQTTMessageInfo:
        """Queue a message; paho sends it now or after the next reconnect (QoS 1 is retried by paho). Its
        MQTTMessageInfo tells when the broker has it.

        `trace` (W3C traceparent headers) travels as MQTT 5 user properties, or in the payload under
        `trace` when the broker speaks only 3.1.1.
        """
        if self._client is None:
            raise RuntimeError("the MQTT link is not started")
        properties = None
        if trace and self._protocol == mqtt.MQTTv5:
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = list(trace.items())
        elif trace:
            payload = {**payload, "trace": trace}
        return self._client.publish(topic, json.dumps(payload, separators=(",", ":")), qos=qos, properties=properties)

    def resubscribe(self, kinds: tuple[str, ...]) -> None:
        """Subscribe again to these inbound kinds of every device: the broker sends their retained messages again
        (retain handling 0). Nothing when not connected: the next connect subscribes anew anyway."""
        client = self._client
        if client is None or not self.connected.is_set():
            return
        client.subscribe([(f"{self.topics.prefix}/+/{kind}", 1) for kind in kinds])

    # paho thread ---------------------------------------------------------------------------

    def _new_client(self) -> mqtt.Client:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self._client_id, protocol=self._protocol)
        if self.address.username is not None:
            client.username_pw_set(self.address.username, self.address.password)
        if self.address.tls:
            client.tls_set_context(self.tls.context())
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        if self.heartbeat is not None:
            client.will_set(self.heartbeat.topic, self.heartbeat.will(), qos=1, retain=True)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        return client

    def _handle_connect(self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any) -> None:
        if reason.is_failure:
            if self._protocol == mqtt.MQTTv5 and reason.value in _UNSUPPORTED_PROTOCOL:
                log.warning("broker refused MQTT 5; falling back to MQTT 3.1.1")
                self._protocol = mqtt.MQTTv311
                self._call_soon(self._spawn_restart)
                return
            log.warning("MQTT connection refused by %s:%s: %s", self.address.host, self.address.port, reason)
            return
        # Subscriptions do not survive a reconnect with a clean session; make them again every time.
        client.subscribe([(topic, 1) for topic in [*self.topics.subscriptions(), *self.extra_subscriptions]])
        if self.heartbeat is not None:
            # Before anything the loop sends after it hears of this connect: devices know we are back first.
            client.publish(self.heartbeat.topic, self.heartbeat.alive(), qos=1, retain=True)
            client.publish(self.heartbeat.topic, self.heartbeat.beat(), qos=0, retain=False)
        self._call_soon(self._mark_connected)

    def _handle_disconnect(self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _p: Any) -> None:
        log.warning("MQTT link to %s:%s lost (%s); reconnecting", self.address.host, self.address.port, reason)
        self._call_soon(self.connected.clear)

    def _handle_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        # One wake-up of the loop per batch, not per message: a device's flood costs the loop its messages'
        # handling (a token bucket drops them cheaply), not thousands of wake-ups besides. deque's append and
        # popleft are atomic: the loop drains until empty, and a message that finds the inbox empty calls it.
        self._inbox.append(Inbound(message.topic, bytes(message.payload), bool(message.retain)))
        if len(self._inbox) == 1:
            self._call_soon(self._drain)

    def _call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(callback, *args)

    # asyncio loop ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Hand what arrived to on_message in order; after DRAIN_BATCH, let other work on the loop run first."""
        for _ in range(DRAIN_BATCH):
            try:
                message = self._inbox.popleft()
            except IndexError:
                return
            try:
                self._on_message(message)
            except Exception:  # one bad message must not leave the rest undrained
                log.exception("handling an MQTT message on %s failed", message.topic)
        if self._inbox and self._loop is not None:
            self._loop.call_soon(self._drain)

    def _mark_connected(self) -> None:
        if self._ever_connected:
            self.reconnects += 1
            metrics.MQTT_RECONNECTS.inc()
        self._ever_connected = True
        log.info("MQTT link up: %s:%s (MQTT %s)", self.address.host, self.address.port,
                 "5" if self._protocol == mqtt.MQTTv5 else "3.1.1")
        self.connected.set()
        self._on_connected()

    def _spawn_restart(self) -> None:
        self._restart_task = asyncio.ensure_future(self._restart_with_new_protocol())

    async def _restart_with_new_protocol(self) -> None:
        old = self._client
        self._client = self._new_client()
        if old is not None:
            await asyncio.to_thread(old.loop_stop)
        self._client.connect_async(self.address.host, self.address.port, keepalive=30)
        self._client.loop_start()
