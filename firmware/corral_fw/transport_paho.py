"""MQTT on CPython with paho-mqtt: the same firmware Device, one MQTT connection per device.

The transport does not run a network loop of its own: whoever owns it drives
the paho client (corral_sim.fleet runs hundreds of them on one thread with
loop_read/loop_write/loop_misc). This module is CPython-only: it compiles with
mpy-cross like the rest of the package but never runs on a board.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

# Bounds the QoS 1 messages (acks, events, status) queued while a link is slow or down.
MAX_QUEUED_MESSAGES = 200


class PahoTransport:
    def __init__(self, device: Any, client_id: str, keepalive_s: int = 30,
                 username: str | None = None, password: str | None = None, tls_context: Any = None) -> None:
        self.device = device
        self.keepalive_s = keepalive_s
        self.connected = False
        self.refusal: str | None = None  # why the broker refused the last CONNECT, if it did
        self.on_link_change: Callable[[PahoTransport, bool], None] | None = None
        # MQTT 3.1.1, as umqtt speaks it on boards: the firmware behaves the same on both.
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                                  clean_session=True)
        self.client.max_queued_messages_set(MAX_QUEUED_MESSAGES)
        if username is not None:
            self.client.username_pw_set(username, password)
        if tls_context is not None:  # an ssl.SSLContext that trusts the broker's CA
            self.client.tls_set_context(tls_context)
        topic, payload = device.will()
        self.client.will_set(topic, payload, qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        device.transport = self

    def connect(self, host: str, port: int) -> None:
        """Open the TCP connection and send CONNECT; the device is told once CONNACK arrives."""
        self.client.connect(host, port, keepalive=self.keepalive_s)

    def reconnect(self) -> None:
        self.client.reconnect()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        if reason_code.is_failure:
            self.refusal = str(reason_code)  # e.g. "Not authorized": the broker closes the connection next
            return
        self.refusal = None
        self.connected = True
        self.device.on_connect()
        if self.on_link_change is not None:
            self.on_link_change(self, True)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self.connected = False
        if self.on_link_change is not None:
            self.on_link_change(self, False)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.device.on_message(message.topic, message.payload, bool(message.retain))

    def publish(self, topic: str, payload: str, retain: bool, qos: int) -> bool:
        if not self.connected:
            return False
        return self.client.publish(topic, payload, qos=qos, retain=retain).rc == MQTTErrorCode.MQTT_ERR_SUCCESS

    def subscribe(self, topic: str, qos: int) -> None:
        self.client.subscribe(topic, qos)

    def close(self) -> None:
        """Clean stop: retained offline first (a Will fires only on an unclean loss), then DISCONNECT."""
        if self.connected:
            self.device.shutdown()
        self.connected = False
        self.client.disconnect()
