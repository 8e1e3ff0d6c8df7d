"""MQTT 5 clients for tests that need the broker's answers (CONNACK, PUBACK and SUBACK reason codes), and
a device played by the test with its own account (a compromised device: any contract, any ack)."""

from __future__ import annotations

import json
import ssl
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode


@dataclass
class Account:
    username: str | None
    password: str | None = None


class Client:
    """An MQTT 5 client on 127.0.0.1:port that waits for the broker's answers and returns their reason codes."""

    def __init__(self, port: int, account: Account, client_id: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.port = port
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5,
                                  client_id=client_id if client_id is not None else account.username or "")
        if tls is not None:
            self.client.tls_set_context(tls)
        if account.username is not None:
            self.client.username_pw_set(account.username, account.password)
        self.connack: ReasonCode | None = None
        self.connected = threading.Event()
        self.dropped = threading.Event()
        self.answers: dict[int, list[ReasonCode]] = {}
        self.answered = threading.Condition()
        self.received: list[mqtt.MQTTMessage] = []
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *_: self.dropped.set()
        self.client.on_publish = lambda _c, _u, mid, code, _p: self._answer(mid, [code])
        self.client.on_subscribe = lambda _c, _u, mid, codes, _p: self._answer(mid, list(codes))
        self.client.on_message = lambda _c, _u, message: self.received.append(message)

    def _on_connect(self, _c: Any, _u: Any, _f: Any, code: ReasonCode, _p: Any) -> None:
        self.connack = code
        self.connected.set()

    def _answer(self, mid: int, codes: list[ReasonCode]) -> None:
        with self.answered:
            self.answers[mid] = codes
            self.answered.notify_all()

    def answer_to(self, mid: int) -> ReasonCode:
        with self.answered:
            assert self.answered.wait_for(lambda: mid in self.answers, 10), f"no answer from the broker to {mid}"
            return self.answers[mid][0]

    def connect(self) -> ReasonCode:
        """The CONNACK's reason code."""
        self.client.connect("127.0.0.1", self.port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(10) or self.dropped.is_set(), "no CONNACK"
        assert self.connack is not None, "the broker closed the connection without a CONNACK"
        return self.connack

    def publish(self, topic: str, payload: str | bytes, retain: bool = False) -> ReasonCode:
        """The PUBACK's reason code (QoS 1)."""
        return self.answer_to(self.client.publish(topic, payload, qos=1, retain=retain).mid)

    def subscribe(self, topic: str) -> ReasonCode:
        """The SUBACK's reason code."""
        _, mid = self.client.subscribe(topic, qos=1)
        return self.answer_to(mid)

    def round_trip(self) -> bool:
        """Whether the connection still answers: a QoS 1 publish to a topic nobody may use, acknowledged."""
        if self.dropped.is_set():
            return False
        info = self.client.publish(f"nobody/{uuid.uuid4().hex}", b"", qos=1)
        with self.answered:
            self.answered.wait_for(lambda: info.mid in self.answers or self.dropped.is_set(), 10)
        return info.mid in self.answers and not self.dropped.is_set()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@contextmanager
def client(port: int, account: Account, client_id: str | None = None,
           tls: ssl.SSLContext | None = None) -> Iterator[Client]:
    c = Client(port, account, client_id, tls)
    try:
        yield c
    finally:
        c.close()


def granted(code: ReasonCode | None) -> bool:
    return code is not None and code.value < 0x80


def logs_in(port: int, account: Account) -> bool:
    """Whether the broker admits this account now."""
    with client(port, account) as c:
        return granted(c.connect())


@dataclass
class PlayedDevice:
    """A device's account in the attacker's hands: it announces any contract and acks commands as it likes."""

    port: int
    prefix: str
    device_id: str
    password: str
    contract: dict[str, Any]
    state: dict[str, Any]
    error: str | None = None  # when set, every command is refused with this error
    commands: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mqtt = Client(self.port, Account(self.device_id, self.password))
        self.mqtt.client.on_message = self._on_command

    def topic(self, kind: str) -> str:
        return f"{self.prefix}/{self.device_id}/{kind}"

    def start(self) -> PlayedDevice:
        self.mqtt.client.will_set(self.topic("status"), "offline", qos=1, retain=True)
        assert granted(self.mqtt.connect())
        assert granted(self.mqtt.subscribe(self.topic("cmd")))
        self.announce(self.contract)
        assert granted(self.mqtt.publish(self.topic("status"), "online", retain=True))
        return self

    def announce(self, contract: dict[str, Any]) -> None:
        self.contract = contract
        assert granted(self.mqtt.publish(self.topic("info"), json.dumps({**contract, "device_id": self.device_id}),
                                         retain=True))

    def _on_command(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        command = json.loads(message.payload)
        self.commands.append(command)
        params = command.get("params") or {}
        if self.error is None and command.get("cmd") != "get_state" and params.get("actuator"):
            self.state[params["actuator"]] = params.get("value")
        ack = {"id": command.get("id"), "ok": self.error is None, "error": self.error, "state": self.state}
        self.mqtt.client.publish(self.topic("ack"), json.dumps(ack), qos=1)

    def sets(self) -> list[tuple[str, Any]]:
        """(actuator, value) of every command that sets something, as the controller sends them (docs/protocol.md)."""
        return [(c["params"]["actuator"], c["params"].get("value")) for c in self.commands
                if c.get("cmd") not in (None, "get_state") and (c.get("params") or {}).get("actuator")]

    def close(self) -> None:
        self.mqtt.close()
