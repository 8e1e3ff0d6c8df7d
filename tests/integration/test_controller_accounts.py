"""Controller replicas each with a broker account of their own (issue 31), on a real Mosquitto.

The broker takes the username as the client id, so two replicas sharing an account would throw each other off.
The local plane's broker has `corral-controller` and `corral-controller-1` to `-3`; the chart's comes from
`corral broker init-dynsec --controller-username` (one per StatefulSet ordinal). Every one of them is connected
at the same time, and each sends commands and heartbeats under the controller's role.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from click.testing import CliRunner

from corral.cli.broker import PASSWORD_ENV, broker
from corral.devcluster import broker as broker_files
from corral.devcluster import files
from corral.devcluster.plane import find_mosquitto
from corral.devcluster.processes import accepts_connections, free_port
from tests.broker_harness import own_broker
from tests.harness import wait_for

pytestmark = pytest.mark.integration


def _client(port: int, username: str, password: str) -> tuple[mqtt.Client, dict[str, Any]]:
    """A started client of this account; `seen` says whether it is connected now and what CONNACK said."""
    seen: dict[str, Any] = {"up": False, "reason": None, "drops": 0}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        seen["reason"] = str(reason)
        seen["up"] = not reason.is_failure

    def on_disconnect(_c: Any, _u: Any, _f: Any, _r: Any, _p: Any) -> None:
        seen["up"] = False
        seen["drops"] += 1

    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    client.connect("127.0.0.1", port, keepalive=10)
    client.loop_start()
    return client, seen


def _watch(port: int, username: str, password: str, topic: str) -> tuple[mqtt.Client, list[tuple[str, bytes]]]:
    heard: list[tuple[str, bytes]] = []
    subscribed = threading.Event()
    client, seen = _client(port, username, password)
    client.on_message = lambda _c, _u, message: heard.append((message.topic, bytes(message.payload)))
    client.on_subscribe = lambda *_: subscribed.set()
    wait_for(lambda: seen["up"], f"{username} to connect ({seen['reason']})", timeout_s=10)
    client.subscribe(topic, qos=1)
    assert subscribed.wait(10), "no SUBACK"
    return client, heard


def _every_account_commands_at_once(port: int, accounts: list[str], password: str, watcher: mqtt.Client,
                                    heard: list[tuple[str, bytes]]) -> None:
    clients = [_client(port, name, password) for name in accounts]
    try:
        wait_for(lambda: all(seen["up"] for _, seen in clients),
                 f"every controller account connected at once: {[(n, s['reason']) for n, (_, s) in zip(accounts, clients, strict=True)]}",
                 timeout_s=10)
        for name, (client, _) in zip(accounts, clients, strict=True):
            client.publish("iot/lamp-1/cmd", name.encode(), qos=1).wait_for_publish(5)
            client.publish("iot/_corral/heartbeat", name.encode(), qos=1).wait_for_publish(5)
        wanted = {(topic, name.encode()) for name in accounts for topic in ("iot/lamp-1/cmd", "iot/_corral/heartbeat")}
        wait_for(lambda: wanted <= set(heard), "every replica's command and heartbeat to reach the watcher")
        assert all(seen["up"] and seen["drops"] == 0 for _, seen in clients), "no replica knocked another off"
    finally:
        for client, _ in clients:
            client.disconnect()
            client.loop_stop()
        watcher.disconnect()
        watcher.loop_stop()


def test_the_local_brokers_four_controller_accounts_connect_together_and_send(tmp_path: Path) -> None:
    with own_broker(tmp_path) as running:
        password = running.broker_passwords["controller"]
        for name in files.LOCAL_CONTROLLER_ACCOUNTS:  # what `plane.mqtt_args_as(name)` hands `corral run`
            assert broker_files.password_file(tmp_path, name).read_text().strip() == password
        watcher, heard = _watch(running.mqtt_port, files.BROKER_ADMIN, running.broker_passwords["admin"], "iot/#")
        _every_account_commands_at_once(running.mqtt_port, list(files.LOCAL_CONTROLLER_ACCOUNTS), password,
                                        watcher, heard)


def test_init_dynsec_accounts_per_ordinal_connect_together_and_no_other_does(tmp_path: Path) -> None:
    """The chart's path: the plugin's state from `init-dynsec --controller-username` per pod, on a real broker."""
    names = ["rel-corral-controller-0", "rel-corral-controller-1"]
    dynsec = tmp_path / "dynamic-security.json"
    args = ["init-dynsec", "--file", str(dynsec)] + [a for n in names for a in ("--controller-username", n)]
    result = CliRunner().invoke(broker, args, env={PASSWORD_ENV: "replica-pw"})
    assert result.exit_code == 0, result.output
    # The chart's broker has no admin account; this test adds the local plane's to watch what the replicas send.
    state = json.loads(dynsec.read_text())
    admin = files.dynsec_config("unused", "admin-pw", (b"s" * 12, b"t" * 12), ("unused",))
    state["clients"] += [c for c in admin["clients"] if c["username"] == files.BROKER_ADMIN]
    state["roles"] += [r for r in admin["roles"] if r["rolename"] == files.BROKER_ADMIN]
    dynsec.write_text(json.dumps(state))
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(files.mosquitto_conf(port, broker_files.plugin_path(), dynsec))
    proc = subprocess.Popen([find_mosquitto(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: accepts_connections(port), f"a broker on port {port}", timeout_s=10)
        stranger, refused = _client(port, files.BROKER_CONTROLLER, "replica-pw")
        wait_for(lambda: refused["reason"] is not None, "the broker to answer the account it was not given")
        assert not refused["up"], f"{files.BROKER_CONTROLLER} was not asked for, yet connected: {refused}"
        stranger.disconnect()
        stranger.loop_stop()
        watcher, heard = _watch(port, files.BROKER_ADMIN, "admin-pw", "iot/#")
        _every_account_commands_at_once(port, names, "replica-pw", watcher, heard)
    finally:
        proc.kill()
        proc.wait(5)
