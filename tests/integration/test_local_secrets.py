"""The local plane keeps its secrets from other local accounts (findings 1 and 13), and the controller's broker
account does only the controller's work.

An attacker running as `nobody` on the same machine tries etcd's ports (plain, and TLS without a client
certificate), and every file of the plane's state: tokens, the kubeconfig, broker passwords, CA and etcd keys.
Beside each refusal, the positive control: the plane's owner reads the same secrets and etcd answers the
API server's client certificate.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.request
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from corral.devcluster import broker as broker_files
from corral.devcluster.files import BROKER_ADMIN, BROKER_CONTROLLER
from corral.devcluster.plane import APISERVER, Plane
from tests.broker_harness import dynsec_at, own_broker
from tests.exposure_harness import as_nobody, listening
from tests.harness import wait_for

pytestmark = pytest.mark.integration


def _apiserver_pid(plane: Plane) -> int:
    return int(json.loads((plane.state_dir / "plane.json").read_text())[APISERVER]["process"]["pid"])


def _etcd_ports(plane: Plane) -> list[int]:
    """etcd is embedded in the API server's process: its listening ports other than the API server's own."""
    api_port = int(plane.server.rsplit(":", 1)[1])
    ports = sorted(port for _, port in listening(_apiserver_pid(plane)) if port != api_port)
    assert len(ports) >= 2, f"etcd's client and peer ports were not found among {ports}"
    return ports


def _count_as_the_api_server(plane: Plane, port: int) -> int | None:
    """Keys under / as etcd tells the holder of the API server's client certificate (None: not etcd's client
    port)."""
    pki = plane.ca_file.parent
    context = ssl.create_default_context(cafile=str(pki / "etcd-ca.crt"))
    context.load_cert_chain(pki / "etcd-apiserver-client.crt", pki / "etcd-apiserver-client.key")
    body = json.dumps({"key": base64.b64encode(b"/").decode(), "range_end": base64.b64encode(b"0").decode(),
                       "count_only": True}).encode()
    request = urllib.request.Request(f"https://127.0.0.1:{port}/v3/kv/range", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return int(json.loads(answer.read()).get("count", 0))
    except OSError:
        return None


def test_nobody_cannot_reach_etcd_which_answers_only_the_api_servers_certificate(plane: Plane) -> None:
    ports = _etcd_ports(plane)
    counts = [_count_as_the_api_server(plane, port) for port in ports]
    assert any(count for count in counts), f"positive control: etcd answers the API server's certificate {counts}"

    seen = as_nobody(ports, int(plane.server.rsplit(":", 1)[1]), [], [])
    assert seen["uid"] == 65534
    assert seen["api"].startswith("HTTP/1.1"), f"the probe reaches the API server as nobody: {seen['api']}"
    for port, (plain, tls) in seen["etcd"].items():
        for answer in (plain, tls):
            assert '"header"' not in answer and '"count"' not in answer, f"etcd on {port} answered nobody: {answer}"


def _secret_files(plane: Plane) -> dict[Path, str]:
    """The plane's credential files, each with a secret it must hold (the positive control reads it)."""
    pki = plane.ca_file.parent
    return {
        plane.state_dir / "tokens.csv": plane.admin_token,
        plane.kubeconfig: plane.admin_token,
        plane.state_dir / "plane.json": plane.broker_passwords["controller"],
        plane.password_file(BROKER_CONTROLLER): plane.broker_passwords["controller"],
        plane.password_file(BROKER_ADMIN): plane.broker_passwords["admin"],
        plane.state_dir / "broker" / "dynamic-security.json": '"salt"',
        plane.state_dir / "broker" / "tls" / "ca.key": "PRIVATE KEY",
        plane.state_dir / "broker" / "tls" / "broker.key": "PRIVATE KEY",
        pki / "etcd-apiserver-client.key": "PRIVATE KEY",
        pki / "etcd-ca.key": "PRIVATE KEY",
        pki / "ca.key": "PRIVATE KEY",
        pki / "sa.key": "PRIVATE KEY",
    }


def test_nobody_can_read_no_credential_file_of_the_plane(plane: Plane) -> None:
    secrets = _secret_files(plane)
    for path, secret in secrets.items():  # positive control: the owner finds each secret where it belongs
        assert secret in path.read_text(), f"{path} does not hold what it should"
        assert path.stat().st_mode & 0o077 == 0, f"{path} has mode {path.stat().st_mode & 0o777:04o}"
    assert plane.state_dir.stat().st_mode & 0o777 == 0o700
    everything = sorted(p for p in plane.state_dir.rglob("*") if p.is_file())
    seen = as_nobody([], int(plane.server.rsplit(":", 1)[1]), everything, [plane.state_dir])
    assert seen["readable"] == [] and seen["listable"] == [], seen


def test_the_controllers_broker_account_commands_devices_but_cannot_speak_as_one(tmp_path: Path) -> None:
    """Finding 1's attacker commanded a device as the controller; the account itself is now trimmed to the
    controller's work: commands, heartbeats and the accounts plugin, never a device's own topics."""
    with own_broker(tmp_path) as running:
        password = broker_files.password_file(tmp_path, BROKER_CONTROLLER).read_text().strip()
        assert password == running.broker_passwords["controller"]
        heard: list[str] = []
        watcher = _client(running.mqtt_port, BROKER_ADMIN, running.broker_passwords["admin"])
        watcher.on_message = lambda _c, _u, message: heard.append(message.topic)
        assert _subscribe(watcher, [("home/#", 1)]) == [1]
        controller = _client(running.mqtt_port, BROKER_CONTROLLER, password)
        try:
            granted = _subscribe(controller, [("home/+/ack", 1), ("#", 1)])
            assert granted == [1, 0x87], "it hears devices' acks, not every topic (0x87: not authorized)"
            # A device's own topics first, then a command: the broker keeps one client's order, so once the
            # command arrived, anything before it that was let through would have arrived already.
            # Under a one-level prefix and a two-level one (home/iot).
            for topic in ("home/lock-1/status", "home/lock-1/ack", "home/lock-1/info", "home/lock-1/cmd",
                          "home/iot/lock-1/telemetry", "home/iot/lock-1/cmd", "home/iot/_corral/heartbeat"):
                controller.publish(topic, b"{}", qos=1).wait_for_publish(5)
            wait_for(lambda: "home/iot/_corral/heartbeat" in heard, "the controller's messages to reach the watcher")
            assert heard == ["home/lock-1/cmd", "home/iot/lock-1/cmd", "home/iot/_corral/heartbeat"], heard
        finally:
            for client in (controller, watcher):
                client.disconnect()
                client.loop_stop()
        # Its username is its client id: one session at a time, so this one comes after the first has gone.
        answers = dynsec_at(running.mqtt_port, (BROKER_CONTROLLER, password), [{"command": "listClients"}])
        assert BROKER_CONTROLLER in answers[0]["data"]["clients"], "it still runs the accounts plugin"


def _client(port: int, username: str, password: str) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)
    connected = threading.Event()
    client.on_connect = lambda *_: connected.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert connected.wait(10), f"{username} could not connect"
    return client


def _subscribe(client: mqtt.Client, topics: list[tuple[str, int]]) -> list[int]:
    granted: list[int] = []
    done = threading.Event()

    def on_subscribe(_c: Any, _u: Any, _mid: Any, codes: list[Any], _p: Any) -> None:
        granted.extend(code.value for code in codes)
        done.set()

    client.on_subscribe = on_subscribe
    client.subscribe(topics)
    assert done.wait(10), "no SUBACK"
    return granted
