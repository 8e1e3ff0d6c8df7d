"""Accounts on the real broker for tests: the plane admits no anonymous client.

The broker uses the username as the client id, so two connections of one account would throw each other
out: every test tool (a watcher, a publisher, a played device) gets an account of its own. `observer`
accounts may use every topic, as the tests' anonymous clients used to; `device_accounts` are exactly what
the controller makes for enrolled devices (`devices.accounts`), so simulated firmware runs under the same
least-privilege ACLs as real devices.
"""

from __future__ import annotations

import json
import secrets
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import paho.mqtt.client as mqtt

from corral.devcluster import broker, files
from corral.devcluster.plane import find_mosquitto
from corral.devcluster.processes import accepts_connections, free_port
from corral.devices.accounts import CONTROL_TOPIC, RESPONSE_TOPIC, Account, plan_accounts
from corral.devices.topics import Topics
from tests.harness import wait_for


class Broker(Protocol):
    """Where a test's clients connect: the plane's broker, or one a test runs itself (own_broker)."""

    @property
    def mqtt_port(self) -> int: ...

    @property
    def broker_passwords(self) -> dict[str, str]: ...

    def mqtt_args_as(self, who: str, tls: bool = False) -> list[str]: ...


@dataclass
class OwnBroker:
    mqtt_port: int
    directory: Path
    broker_passwords: dict[str, str] = field(default_factory=broker.new_passwords)
    tls_port: int = field(default_factory=free_port)

    def mqtt_args_as(self, who: str, tls: bool = False) -> list[str]:
        """`corral run` options that connect as `who`: the username in the URL, the password by file."""
        port = self.tls_port if tls else self.mqtt_port
        return ["--mqtt", f"{'mqtts' if tls else 'mqtt'}://{quote(who)}@127.0.0.1:{port}",
                "--mqtt-password-file", str(broker.password_file(self.directory, who))]


@contextmanager
def own_broker(directory: Path, port: int | None = None,
               passwords: dict[str, str] | None = None) -> Iterator[OwnBroker]:
    """A Mosquitto of the test's own, configured as the plane's (accounts, ACLs, TLS), until the block ends.
    Started again with the same port and passwords, it is the same broker after a restart."""
    own = OwnBroker(port or free_port(), directory, **({"broker_passwords": passwords} if passwords else {}))
    prepared = broker.prepare(directory, own.mqtt_port, own.tls_port, own.broker_passwords)
    proc = subprocess.Popen([find_mosquitto(), "-c", str(prepared.conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _listening(proc, own.mqtt_port), f"a broker on port {own.mqtt_port}", timeout_s=10)
        yield own
    finally:
        proc.kill()
        proc.wait(5)


def _listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"mosquitto exited with {proc.returncode}")
    return accepts_connections(port)


_admin = threading.Lock()  # the admin's username is its client id: one admin session at a time


def dynsec(plane: Broker, commands: list[dict[str, Any]], timeout_s: float = 30.0,
           check: bool = True) -> list[dict[str, Any]]:
    """Send commands to the dynamic security plugin as the broker admin; its answers, one per command
    (with `check`, an error in any of them fails the test)."""
    with _admin:
        return dynsec_at(plane.mqtt_port, (files.BROKER_ADMIN, plane.broker_passwords["admin"]), commands,
                         timeout_s=timeout_s, check=check)


def dynsec_at(port: int, account: tuple[str, str], commands: list[dict[str, Any]], *,
              tls: ssl.SSLContext | None = None, timeout_s: float = 30.0, check: bool = True) -> list[dict[str, Any]]:
    """Send commands to the dynamic security plugin of the broker on 127.0.0.1:port as this account."""
    question = uuid.uuid4().hex
    answered, subscribed = threading.Event(), threading.Event()
    answer: list[dict[str, Any]] = []

    def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        responses = json.loads(message.payload).get("responses") or []
        if responses and str(responses[0].get("correlationData", "")).startswith(question):
            answer.extend(responses)
            answered.set()

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=account[0], protocol=mqtt.MQTTv5)
    client.username_pw_set(*account)
    if tls is not None:
        client.tls_set_context(tls)
    client.on_message = on_message
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        client.subscribe(RESPONSE_TOPIC, qos=1)
        assert subscribed.wait(10), f"{account[0]} could not subscribe to the plugin's answers"
        tagged = [{**c, "correlationData": f"{question}/{i}"} for i, c in enumerate(commands)]
        client.publish(CONTROL_TOPIC, json.dumps({"commands": tagged}), qos=1).wait_for_publish(10)
        assert answered.wait(timeout_s), "the dynamic security plugin did not answer"
    finally:
        client.disconnect()
        client.loop_stop()
    failed = [(c["command"], a.get("error")) for c, a in zip(commands, answer, strict=False) if a.get("error")]
    assert not (check and failed), f"the broker refused: {failed}"
    return answer


def observer(plane: Broker, name: str | None = None) -> tuple[str, str]:
    """A new account that may use every topic: (username, password)."""
    username = f"test-{name or 'observer'}-{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(16)
    dynsec(plane, [{"command": "createClient", "username": username, "password": password,
                    "roles": [{"rolename": files.BROKER_ADMIN}]}])
    return username, password


def device_accounts(plane: Broker, prefix: str, passwords: dict[str, str]) -> None:
    """The accounts the controller keeps for these enrolled devices (device id -> password), made now.

    A running controller may make the same accounts at the same moment: what it made first ("already
    exists") is planned again from the broker's new state, as the controller itself would."""
    topics = Topics(prefix)
    wanted = {device_id: Account(device_id, password) for device_id, password in passwords.items()}
    for _ in range(3):
        listed = dynsec(plane, [{"command": "listClients", "verbose": True}, {"command": "listRoles", "verbose": True}])
        # Only these devices: accounts of the same prefix for other ids are not this call's to delete.
        clients = [c for c in listed[0]["data"]["clients"] if c["username"] in wanted]
        commands = plan_accounts(topics, wanted, clients, listed[1]["data"]["roles"])
        if not commands:
            return
        answers = dynsec(plane, commands, check=False)
        errors = {a.get("error") for a in answers} - {None}
        if not errors:
            return
        assert errors <= {"Role already exists", "Client already exists"}, f"the broker refused: {errors}"
    raise AssertionError(f"the accounts of {sorted(passwords)} kept changing under the test")


def connected(plane: Broker, username: str, password: str, protocol: int = mqtt.MQTTv311) -> mqtt.Client:
    """A started client of this account (the username is its client id)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=protocol)
    client.username_pw_set(username, password)
    client.connect("127.0.0.1", plane.mqtt_port, keepalive=10)
    client.loop_start()
    return client
