"""The README's main command, `./scripts/up` (bootstrap, then `corral demo`): it reaches ready, an MCP client
lists tools, and a stop signal ends everything it started, however it was started. Also `corral demo
--kubeconfig` on an existing cluster.

Each test starts the demo in a process group of its own and, whatever happens, kills that group and the
plane in the end: a failing demo test must not leave a plane, broker, controller and gateway behind.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.cli.main import cli
from corral.client.enroll import secret_name
from corral.client.signing import read_key
from corral.contract.signature import public_pem, signed_contract
from corral.devcluster.demo import SIGNING_KEY_FILE, SIGNING_KEYS_SECRET
from corral.devcluster.files import BROKER_CONTROLLER
from corral.devcluster.plane import DevPlane, Plane
from corral.devcluster.processes import accepts_connections, free_port
from corral_sim.catalog import contract_for
from corral_sim.presets import preset
from tests.controller_harness import CORRAL, device, devices
from tests.exposure_harness import as_nobody, exposed, listening, process_tree
from tests.fleet_harness import running_fleet
from tests.gateway_harness import MODERN, http_client
from tests.harness import api_client, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _ignore_sigint() -> None:
    # What a background job of a non-interactive shell (or nohup, or some CI runners) inherits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def demo_process(argv: list[str], state: Path, **options: Any) -> Iterator[subprocess.Popen[str]]:
    demo = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **options)
    try:
        yield demo
    finally:
        if demo.poll() is None:  # the test failed before the demo stopped: take everything down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGTERM)
            try:
                demo.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(demo.pid, signal.SIGKILL)
                demo.wait(10)
        DevPlane(state, progress=lambda line: None).down()


@dataclass
class Home:
    """`./scripts/up` running: the demo's process, its state directory, the gateway's port and what it printed."""

    demo: subprocess.Popen[str]
    state: Path
    port: int
    text: str
    planted: str  # a secret in the demo's own environment, as a user's shell may export one


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    """One demo for the module, started as a background job would be (SIGINT ignored), its output through a
    pipe. The last test of the module stops it; whatever happens, the fixture takes it down."""
    port, planted = free_port(), f"planted-{uuid.uuid4().hex}"
    state = tmp_path_factory.mktemp("demo") / "state"
    with demo_process([str(REPO / "scripts" / "up"), "--state-dir", str(state), "--port", str(port)], state,
                      preexec_fn=_ignore_sigint, env={**os.environ, "GITHUB_TOKEN": planted}) as demo:
        yield Home(demo, state, port, "".join(_until_ready(demo)), planted)


def _running(home: Home) -> Plane:
    assert home.demo.poll() is None, "the demo stopped before this test (the stop test must come last)"
    plane = DevPlane(home.state).running()
    assert plane is not None, "the demo's plane is not running"
    return plane


def _secrets(home: Home, plane: Plane) -> dict[str, str]:
    """Every secret the demo and its plane hold (what -> value), read from where they are kept."""
    found = {"agent token": (home.state / "agent-token").read_text().strip(), "admin token": plane.admin_token,
             "user token": plane.user_token, **{f"broker password ({who})": password
                                                for who, password in plane.broker_passwords.items()}}
    devices = json.loads((home.state / "demo-credentials.json").read_text())["devices"]
    found.update({f"password of device {device_id}": entry["password"] for device_id, entry in devices.items()})
    for key in [*home.state.rglob("*.key"), *home.state.rglob("*.pem")]:
        body = [line for line in key.read_text().splitlines() if line and not line.startswith("-----")]
        if "PRIVATE KEY" in key.read_text() and body:
            found[f"key {key.relative_to(home.state)}"] = body[0][:40]
    return found


def test_no_process_the_demo_starts_has_a_secret_in_its_arguments_or_environment(home: Home) -> None:
    """Finding 1: the controller's broker password was in its command line, readable by every local account,
    and the demo handed its whole environment to every child. Read as root, as the kernel shows them."""
    plane = _running(home)
    secrets = _secrets(home, plane)
    # Positive control: the secrets exist where they are kept, and the controller connected with its password
    # from a file (every device is online).
    assert plane.password_file(BROKER_CONTROLLER).read_text().strip() == plane.broker_passwords["controller"]
    assert len(secrets) > 48 and all(len(value) >= 16 for value in secrets.values()), secrets.keys()
    assert "enrolled devices online: 43/43" in (home.state / "demo-logs" / "demo.log").read_text()
    processes = [p for pid in process_tree(home.demo.pid) if (p := exposed(pid)) is not None]
    commands = [" ".join(p.argv) for p in processes]
    for started in ("corral.cli.main sim", "corral.cli.main run", "corral.cli.main mcp", "mosquitto", " serve "):
        assert any(started in command for command in commands), f"{started!r} is not among {commands}"
    leaks = [(p.pid, p.argv[:3], what) for p in processes for what, value in secrets.items()
             if value in "\0".join(p.argv) or any(value in v for v in p.environ.values())]
    assert leaks == []
    # What the demo's own environment held reaches none of its children (the demo itself has it).
    assert processes[0].pid == home.demo.pid and processes[0].environ.get("GITHUB_TOKEN") == home.planted
    assert [p.argv[:3] for p in processes[1:] if home.planted in "\0".join(p.environ.values())] == []
    for p in processes:
        assert not {"CORRAL_MQTT_URL", "CORRAL_TOKEN"} & set(p.environ), (p.argv[:3], sorted(p.environ))
    # Nor in the env file a shell would source.
    env_text = (home.state / "env").read_text()
    assert not [what for what, value in secrets.items() if value in env_text]


def test_every_process_the_demo_starts_listens_on_loopback_only_and_nobody_reads_its_files(home: Home) -> None:
    """Findings 12 and 13: the controller's HTTPS reader and health port listened on every interface; a local
    user could read the plane's and the demo's credentials. Positive control: they listen, and root reads."""
    plane = _running(home)
    sockets = {" ".join(p.argv[:4]): listening(p.pid) for pid in process_tree(home.demo.pid)
               if (p := exposed(pid)) is not None}
    controller = next(ports for command, ports in sockets.items() if "corral.cli.main run" in command)
    assert len(controller) >= 2, f"the controller's health and reader ports: {controller}"
    assert any(port == home.port for _, port in sockets[next(c for c in sockets if "corral.cli.main mcp" in c)])
    wide = {command: ports for command, ports in sockets.items()
            if any(address not in ("127.0.0.1", "::1") for address, _ in ports)}
    assert wide == {}
    files = sorted(p for p in home.state.rglob("*") if p.is_file())
    assert (home.state / "agent-token") in files and (home.state / "demo-credentials.json") in files
    assert home.state.stat().st_mode & 0o777 == 0o700
    seen = as_nobody([], int(plane.server.rsplit(":", 1)[1]), files, [home.state])
    assert seen["api"].startswith("HTTP/1.1"), seen["api"]  # the probe itself works as nobody
    assert seen["readable"] == [] and seen["listable"] == []


def test_the_demo_requires_signed_contracts_and_refuses_an_unsigned_or_forged_one(home: Home) -> None:
    """The demo runs as the chart does by default: its controller requires signatures, trusting the key the demo
    made (0600 in its state directory) and published in a Secret; the catalog's firmware is signed with it, and
    every simulated device comes online. A device announcing an unsigned contract, or one signed by another key,
    is refused; beside them one signed with the demo's key by `corral contracts sign` is taken."""
    plane = _running(home)
    key = home.state / SIGNING_KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    controller = next(p.argv for pid in process_tree(home.demo.pid)
                      if (p := exposed(pid)) is not None and "corral.cli.main run" in " ".join(p.argv))
    assert "--require-signatures" in controller
    assert controller[controller.index("--signing-keys") + 1] == f"home/{SIGNING_KEYS_SECRET}"
    admin = api_client(plane)
    trusted = kubernetes.client.CoreV1Api(admin).read_namespaced_secret(SIGNING_KEYS_SECRET, "home").data
    assert {k: base64.b64decode(v) for k, v in trusted.items()} == {"demo": public_pem(read_key(key))}
    home_devices = devices(admin, "home")
    simulated = [spec.device_id for spec in preset("home")]
    assert len(simulated) == 43 and [d for d in simulated if not (home_devices[d].get("status") or {}).get("online")
                                     or not home_devices[d]["status"].get("capability")] == []
    signed = CliRunner().invoke(cli, ["contracts", "sign", "relay", "--key", str(key)])
    assert signed.exit_code == 0, signed.output
    contracts = {"signed-plug": json.loads(signed.stdout)["relay"], "unsigned-plug": contract_for("relay"),
                 "forged-plug": signed_contract(contract_for("relay"), Ed25519PrivateKey.generate())}
    try:
        with running_fleet(plane, "iot", dict.fromkeys(contracts, "relay"), enroll_in=(admin, "home"),
                           contracts=contracts):
            wait_for(lambda: (device(admin, "home", "signed-plug").get("status") or {}).get("capability"),
                     "the contract signed with the demo's key accepted", timeout_s=30)
            for name, why in (("unsigned-plug", "contract signature unsigned"),
                              ("forged-plug", "matches no trusted key (trusted: demo)")):
                refused = wait_for(functools.partial(_contract_refused, admin, name), f"{name} refused", timeout_s=20)
                assert refused is not None and why in refused["message"], refused
                assert "capability" not in device(admin, "home", name)["status"]
    finally:
        objects, core = kubernetes.client.CustomObjectsApi(admin), kubernetes.client.CoreV1Api(admin)
        for name in contracts:  # the demo's home again as it was: the tests after this one count its devices
            with contextlib.suppress(kubernetes.client.ApiException):
                objects.delete_namespaced_custom_object("corral.dev", "v1alpha1", "home", "devices", name)
            with contextlib.suppress(kubernetes.client.ApiException):
                core.delete_namespaced_secret(secret_name(name), "home")
        wait_for(lambda: not set(contracts) & set(devices(admin, "home")), "the extra Devices to be gone",
                 timeout_s=30)


def test_the_demos_devices_carry_the_names_and_rooms_of_its_household(home: Home) -> None:
    """The approval card and `kubectl get devices` read "Front door" in the "Hallway", not the device id twice."""
    home_devices = devices(api_client(_running(home)), "home")
    overlays = {d: (home_devices[d].get("spec") or {}).get("overlay") for d in (s.device_id for s in preset("home"))}
    assert overlays["front-door-lock"] == {"alias": "Front door", "location": "Hallway"}
    assert [d for d, overlay in overlays.items() if not (overlay or {}).get("alias")] == []


def _contract_refused(admin: kubernetes.client.ApiClient, name: str) -> dict[str, Any] | None:
    conditions = (device(admin, "home", name).get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "ContractValid" and c["status"] == "False"), None)


def test_the_demo_runs_the_product_and_a_stop_signal_ends_all_of_it_even_with_sigint_ignored_and_no_terminal(
        home: Home) -> None:
    """Started as a background job would be (SIGINT ignored), its output through a pipe that goes away before
    the stop (as `./scripts/up 2>&1 | tee demo.log` after Ctrl-C), then told to stop with SIGINT."""
    demo, state, port, text = home.demo, home.state, home.port, home.text
    assert f"http://127.0.0.1:{port}/mcp" in text and "kubectl get devices -n home" in text
    token = (state / "agent-token").read_text()

    async def agent() -> tuple[list[str], int, dict[str, Any]]:
        async with http_client(f"http://127.0.0.1:{port}/mcp", token, mode=MODERN) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            devices = (await client.call_tool("iot.list_devices", {})).structured_content["devices"]
            read = await client.call_tool("iot.read", {"device_id": "home/bedroom-fan", "window_s": 0})
            return tools, len(devices), dict(read.structured_content or {})

    tools, devices, read = asyncio.run(agent())
    assert "iot.control" in tools and devices == 43
    assert "metrics" in read, read
    plane = DevPlane(state).running()
    assert plane is not None
    raw = subprocess.run([str(plane.kubectl), "--kubeconfig", str(plane.kubeconfig), "get", "--raw",
                          "/apis/readings.corral.dev/v1alpha1/namespaces/home/devices/bedroom-fan"],
                         capture_output=True, text=True, timeout=30)
    assert raw.returncode == 0 and json.loads(raw.stdout)["kind"] == "DeviceReadings", raw.stderr
    assert demo.stdout is not None
    demo.stdout.close()  # the reader is gone: every write to the pipe fails from now on
    demo.send_signal(signal.SIGINT)
    code = demo.wait(90)
    assert code == 0
    assert "SIGINT: stopping what the demo started" in (state / "demo-logs" / "demo.log").read_text()
    assert DevPlane(state).running() is None, "the plane the demo started must be stopped"
    assert not accepts_connections(port), "the gateway must be stopped"
    assert not accepts_connections(plane.mqtt_port), "the broker must be stopped"


def test_the_demo_runs_on_an_existing_cluster_with_a_private_broker_and_sigterm_stops_it(
        plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path: Path) -> None:
    port, namespace = free_port(), f"demo-{uuid.uuid4().hex[:6]}"
    with demo_process([CORRAL, "demo", "--kubeconfig", str(plane.kubeconfig), "--namespace", namespace,
                       "--state-dir", str(tmp_path), "--port", str(port)], tmp_path) as demo:
        try:
            lines = _until_ready(demo)
            broker = next(line.split()[-1] for line in lines if line.strip().startswith("broker"))
            assert broker != plane.mqtt_url, "a private broker, not the cluster's"

            async def agent() -> int:
                async with http_client(f"http://127.0.0.1:{port}/mcp", (tmp_path / "agent-token").read_text()) as client:
                    return len((await client.call_tool("iot.list_devices", {})).structured_content["devices"])

            assert asyncio.run(agent()) == 43
            demo.send_signal(signal.SIGTERM)  # what a service manager, `timeout` or `kill` sends
            code = demo.wait(90)
        finally:
            kubernetes.client.CoreV1Api(corral_api).delete_namespace(namespace)
            kubernetes.client.RbacAuthorizationV1Api(corral_api).delete_cluster_role_binding(
                "corral-demo-capability-reader")
    assert code == 0
    assert not accepts_connections(int(broker.rsplit(":", 1)[1])), "the private broker must be stopped"
    assert not accepts_connections(port), "the gateway must be stopped"


def _until_ready(demo: subprocess.Popen[str], timeout_s: float = 180) -> list[str]:
    lines: list[str] = []
    assert demo.stdout is not None
    stream = demo.stdout

    def read() -> None:  # until ready, then the test owns the pipe
        for line in iter(stream.readline, ""):
            lines.append(line)
            if line.startswith("ready"):
                return

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not any(line.startswith("ready") for line in lines):
        assert demo.poll() is None, f"the demo exited with {demo.returncode}: {''.join(lines)[-3000:]}"
        assert time.monotonic() < deadline, f"no 'ready' within {timeout_s:.0f} s; so far: {lines}"
        time.sleep(0.5)
    return lines
