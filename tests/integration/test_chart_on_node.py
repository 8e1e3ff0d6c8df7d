"""Corral's chart on the real node, installed as a k3s user installs it (issue 28's acceptance).

The install is the chart README's own block ("Install on k3s", read back by tests/chart_readme.py), run by bash in
a directory of its own with the images built here named as that README says. Devices, an agent and a person then
reach the product only through the node's ports, as they would at home: a light and a lock of Corral's firmware
(in this process, so their simulated hardware can be read) over MQTT with TLS to the broker's node port, an MCP
client to the gateway's, a browser to the approval page's. The tests share one install and run in file order:
what they do to it (a deleted Pod, a killed process, an upgrade) comes after what only reads it, and the last test
uninstalls and installs again.

The controller runs as the chart's default, 2 replicas that elect a leader (issue 31), with short lease timings
(LEASE_S/RENEW_S/RETRY_S) so a failover is quick. The leader is the holder of the Lease corral-controller-shard-0.
What the controllers sent is read where it arrives: every command the broker delivers to the devices' own
subscriptions (<prefix>/<id>/cmd) is recorded with its epoch (CommandSpy), and the simulated hardware says what was
done; neither comes from a controller's own account of itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from playwright.sync_api import expect, sync_playwright

from corral.client.intents import submit, wait_settled
from corral.client.signing import firmware_contracts
from corral.devcluster.images import NodeImage, ensure_images, import_images
from corral.devcluster.node import NodePlane
from corral.devcluster.nodedemo import image_values
from corral.devcluster.processes import free_port
from corral.devices.credentials import read_credentials
from corral_sim.fleet import Broker, DeviceSpec, Fleet, FleetOptions, _FleetTransport
from tests.chart_readme import k3s_install_commands, uninstall_leaves
from tests.fleet_harness import hardware_applies, hardware_applies_at
from tests.gateway_harness import http_client
from tests.harness import wait_for
from tests.helm_harness import helm_binary
from tests.node_harness import exec_in, kubectl, pod_manifest

REPO = Path(__file__).resolve().parents[2]
CORRAL_BIN = REPO / ".venv" / "bin"
NAMESPACE = RELEASE = "corral"  # the README's
MQTTS_PORT, GATEWAY_PORT, CONSOLE_PORT = 30883, 30800, 30880  # values-k3s.yaml's node ports
CORRAL_COMPONENTS = ("controller", "gateway", "console")
CHROMIUM = "/usr/bin/chromium"
UPGRADE_VERSION = "0.2.0"  # the image helm upgrade goes to: scripts/test builds it before the tests, as a cold build
REPLICAS = 2  # the chart's default
LEASE_S, RENEW_S, RETRY_S = 6, 4, 1  # the install's leader election timings: short, so a failover takes seconds
LEADER_LEASE = "corral-controller-shard-0"
ELECTION_SETS = [f"controller.leaderElection.leaseDurationSeconds={LEASE_S}",
                 f"controller.leaderElection.renewDeadlineSeconds={RENEW_S}",
                 f"controller.leaderElection.retryPeriodSeconds={RETRY_S}"]


@dataclass
class Delivered:
    """A command as the broker delivered it to a device's subscription: when (this process's monotonic clock),
    to which device, its id and its epoch (None: sent without one)."""

    at: float
    device_id: str
    command_id: str
    epoch: int | None


class CommandSpy:
    """Every command the devices of the fleet receive from the broker on their cmd topics, before the firmware
    judges it (a refused stale epoch is recorded too): what a controller really sent, whatever it believes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[Delivered] = []

    def record(self, topic: str, payload: bytes) -> None:
        parts = topic.split("/")
        if len(parts) != 3 or parts[2] != "cmd":
            return
        try:
            command = json.loads(payload)
        except ValueError:
            return
        epoch = command.get("epoch")
        with self._lock:
            self._seen.append(Delivered(time.monotonic(), parts[1], str(command.get("id")),
                                        int(epoch) if epoch is not None else None))

    def seen(self) -> list[Delivered]:
        with self._lock:
            return list(self._seen)

    def ids_under_two_epochs(self) -> dict[str, set[int | None]]:
        """Command ids delivered with more than one epoch: one command sent by two replicas."""
        epochs: dict[str, set[int | None]] = {}
        for d in self.seen():
            epochs.setdefault(d.command_id, set()).add(d.epoch)
        return {i: e for i, e in epochs.items() if len(e) > 1}


@dataclass
class Install:
    """The chart installed by the README's commands; where they ran, and how to run more like them."""

    node: NodePlane
    work: Path  # the README's working directory: vendor.pem, signed.json, devices.json, agent.token, alice.token, ...
    env: dict[str, str]
    readme: subprocess.Popen[bytes]  # the README's shell; its `corral sim ... &` (the porch light) lives on in its group
    images: dict[str, NodeImage]
    helm_sets: list[str]
    fleet: Fleet | None = None
    spy: CommandSpy = field(default_factory=CommandSpy)
    controller_key: Path = Path()
    say: Any = print
    stream_errors: list[str] = field(default_factory=list)

    @property
    def gateway_url(self) -> str:
        return f"http://{self.node.node_ip}:{GATEWAY_PORT}/mcp"

    @property
    def console_url(self) -> str:
        return f"http://{self.node.node_ip}:{CONSOLE_PORT}"

    def token(self, name: str) -> str:
        return (self.work / f"{name}.token").read_text().strip()

    def run(self, *argv: str, check: bool = True, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """A command as the README's user runs it: in its directory, with its PATH and KUBECONFIG."""
        done = subprocess.run(list(argv), cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        return json.loads(kubectl(self.node, *args, "-o", "json").stdout)

    def pods(self, component: str | None = None, release: str = RELEASE) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={release}"
        if component:
            selector += f",app.kubernetes.io/component={component}"
        return list(self.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"])


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _say(request: pytest.FixtureRequest) -> Any:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is None:
            return
        # Past the capture: the figures of a passing test (failover times) belong in the run's output too.
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line(f"[k3s install] {line}")
    return say


@pytest.fixture(scope="module")
def k3s(node_plane: NodePlane, request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    say = _say(request)
    node = node_plane
    images = ensure_images(say, names=["corral", "mosquitto"])
    import_images(str(node.ctr), node.containerd_socket, images.values(), say)
    helm = helm_binary(say)
    work = tmp_path_factory.mktemp("k3s-user")
    (work / "charts").symlink_to(REPO / "charts")  # the README runs from a checkout: charts/corral
    env = {**os.environ, "KUBECONFIG": str(node.kubeconfig),
           "PATH": os.pathsep.join([str(CORRAL_BIN), str(node.kubectl.parent), str(helm.parent), os.environ["PATH"]])}
    helm_sets = [*image_values({name: image.ref for name, image in images.items()}), *ELECTION_SETS]
    script = "set -euo pipefail\n" + "\n".join(k3s_install_commands(node.node_ip, helm_sets)) + "\n"
    (work / "install.sh").write_text(script)
    log = (work / "install.log").open("wb")
    started = time.monotonic()
    readme = subprocess.Popen(["bash", "install.sh"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    install = Install(node, work, env, readme, images, helm_sets, say=say)
    try:
        code = readme.wait(timeout=900)
        if code != 0:
            raise AssertionError(f"the README's k3s install failed ({code}):\n{(work / 'install.log').read_text()}")
        say(f"the README's install, from the first command to every workload Ready, took "
            f"{time.monotonic() - started:.0f}s")
        _take_audit_key(install)
        with _spying(install.spy), _lock_and_light(install) as fleet:
            install.fleet = fleet
            yield install
    finally:
        _stop_group(readme.pid)
        log.close()
        kubectl(node, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


@contextmanager
def _spying(spy: CommandSpy) -> Iterator[None]:
    """Record what the broker delivers to the fleet's devices (their transport, before the firmware)."""
    original = _FleetTransport._on_message

    def on_message(self: _FleetTransport, client: Any, userdata: Any, message: Any) -> None:
        spy.record(message.topic, message.payload)
        original(self, client, userdata, message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_FleetTransport, "_on_message", on_message)
        yield


def _stop_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _take_audit_key(install: Install) -> None:
    """The README's verifier takes the controller's public key once, at install, and an auditor's identity."""
    secret = install.kubectl_json("get", "secret", "corral-audit-keys", "-n", NAMESPACE)
    pem = base64.b64decode(secret["data"]["controller.pem"]).decode()
    public = subprocess.run([str(CORRAL_BIN / "corral"), "audit", "public-key", "-"], input=pem, capture_output=True,
                            text=True, check=True, env=install.env, cwd=install.work)
    install.controller_key = install.work / "controller.pub.pem"
    install.controller_key.write_text(public.stdout)
    install.run("kubectl", "create", "serviceaccount", "auditor", "-n", NAMESPACE)
    install.run("kubectl", "create", "clusterrolebinding", "corral-test-auditor", "--clusterrole",
                "corral-audit-reader", "--serviceaccount", f"{NAMESPACE}:auditor")


@contextmanager
def _lock_and_light(install: Install) -> Iterator[Fleet]:
    """A light and a lock enrolled with `corral devices enroll`, running Corral's firmware built with the README's
    signed contracts, connected over TLS to the broker's node port only."""
    corral = str(CORRAL_BIN / "corral")
    install.run(corral, "devices", "enroll", "desk-light", "--type", "light", "--device-id", "light-2",
                "-n", NAMESPACE, "--write", "fleet.json")
    install.run(corral, "devices", "enroll", "front-lock", "--type", "lock", "--device-id", "lock-1",
                "-n", NAMESPACE, "--write", "fleet.json")
    broker = Broker(install.node.node_ip, MQTTS_PORT, credentials=read_credentials(str(install.work / "fleet.json")),
                    tls=True, ca_file=str(install.work / "broker-ca.crt"))
    options = FleetOptions(reconnect_min_s=0.2, reconnect_max_s=2.0, connect_spread_s=0.1, auto_inputs=False,
                           firmware_contracts=firmware_contracts(install.work / "signed.json"))
    fleet = Fleet([DeviceSpec("light", "light-2"), DeviceSpec("lock", "lock-1")], broker, options)
    thread = threading.Thread(target=fleet.run, name="fleet", daemon=True)
    thread.start()
    try:
        for device in ("porch-light", "desk-light", "front-lock"):
            wait_for(functools.partial(_online, install, device),
                     f"Device {device} online over mqtts://NODE:{MQTTS_PORT}", timeout_s=90, interval_s=0.5)
        yield fleet
    finally:
        fleet.stop()
        thread.join(15)


def _online(install: Install, device: str) -> bool:
    return (install.kubectl_json("get", "device", device, "-n", NAMESPACE).get("status") or {}).get("online") is True


# ---------------------------------------------------------------------------------------------------------------
# Verifying the audit chain as the README's reader does: through `kubectl port-forward` to the controller's Service.


@contextmanager
def _port_forward(install: Install, pod: str) -> Iterator[int]:
    """To one controller Pod: each serves its own chain (the Service would pick either)."""
    port = free_port()
    forward = subprocess.Popen(install.node.kubectl_argv("port-forward", "-n", NAMESPACE, f"pod/{pod}",
                                                         f"{port}:8443"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert forward.stdout is not None
        first = forward.stdout.readline()
        assert "Forwarding from" in first, f"kubectl port-forward: {first}{forward.stdout.read() if forward.poll() else ''}"
        yield port
    finally:
        forward.terminate()
        forward.wait(10)


def audit_range(install: Install, pod: str) -> tuple[int, int]:
    """`corral audit verify` against one controller Pod's chain (the key taken at install) and the checkpoint
    object that Pod publishes: passes, or the test fails; the first and last sequence numbers it checked."""
    ca = install.kubectl_json("get", "configmap", "corral-controller-serving-ca", "-n", NAMESPACE)["data"]["ca.crt"]
    (install.work / "ca.crt").write_text(ca)
    token = install.run("kubectl", "create", "token", "auditor", "-n", NAMESPACE).stdout.strip()
    token_file = install.work / "auditor.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    with _port_forward(install, pod) as port:
        done = install.run(str(CORRAL_BIN / "corral"), "audit", "verify", "--server", f"https://localhost:{port}",
                           "--ca-file", "ca.crt", "--token-file", str(token_file), "--key",
                           str(install.controller_key), "--checkpoint-object", f"{NAMESPACE}/corral-controller-{pod}",
                           check=False)
    assert done.returncode == 0, f"corral audit verify failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    match = re.search(r"seq (\d+)-(\d+)", done.stdout)
    assert match, done.stdout
    return int(match.group(1)), int(match.group(2))


# ---------------------------------------------------------------------------------------------------------------
# An agent through the gateway's node port.


def control(install: Install, device: str, actuator: str, action: str, value: Any, request_id: str,
            wait_s: float = 0) -> dict[str, Any]:
    async def call() -> dict[str, Any]:
        async with http_client(install.gateway_url, install.token("agent")) as agent:
            done = await agent.call_tool("iot.control", {
                "device_id": device, "actuator": actuator, "action": action, "params": {"value": value},
                "reason": "issue 28 acceptance", "request_id": request_id})
            assert not done.is_error, done.content
            out = dict(done.structured_content or {})
            if wait_s and out.get("code") not in FINAL:
                status = await agent.call_tool("iot.intent_status", {"request_id": request_id, "wait_s": wait_s})
                out = dict(status.structured_content or {})
            return out
    return asyncio.run(call())


def intent_status(install: Install, request_id: str, wait_s: float) -> dict[str, Any]:
    async def call() -> dict[str, Any]:
        async with http_client(install.gateway_url, install.token("agent")) as agent:
            done = await agent.call_tool("iot.intent_status", {"request_id": request_id, "wait_s": wait_s})
            return dict(done.structured_content or {})
    return asyncio.run(call())


FINAL = {"EXECUTED", "DEDUP", "NOOP", "DENIED", "REFUSED", "EXPIRED", "FAILED", "TIMEOUT"}


# ---------------------------------------------------------------------------------------------------------------
# The tests, in the order they run.


def test_every_workload_is_ready_through_its_own_probes_as_10001_on_a_read_only_root(k3s: Install) -> None:
    pods = k3s.pods()
    components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
    assert {"controller", "gateway", "console", "mosquitto"} <= components, components
    assert all(_ready(p) for p in pods), [(p["metadata"]["name"], p["status"].get("conditions")) for p in pods]
    for pod in pods:
        for container in pod["spec"]["containers"]:
            assert container.get("readinessProbe"), f"{pod['metadata']['name']}/{container['name']} has no probe"
    assert sorted(p["metadata"]["name"] for p in k3s.pods("controller")) == [
        f"corral-controller-{i}" for i in range(REPLICAS)], "the chart's default: a StatefulSet of 2"
    for component in CORRAL_COMPONENTS:
        for pod in k3s.pods(component):
            name = pod["metadata"]["name"]
            assert exec_in(k3s.node, name, NAMESPACE, "id", "-u").stdout.strip() == "10001"
            wrote = exec_in(k3s.node, name, NAMESPACE, "touch", "/written-by-a-test", check=False)
            assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, (component, wrote)
    [broker] = k3s.pods("mosquitto")
    assert exec_in(k3s.node, broker["metadata"]["name"], NAMESPACE, "id", "-u").stdout.strip() == "1883"
    for i in range(REPLICAS):  # one audit chain per ordinal, each on its own volume
        claim = k3s.kubectl_json("get", "pvc", f"audit-corral-controller-{i}", "-n", NAMESPACE)
        assert claim["status"]["phase"] == "Bound" and claim["spec"]["storageClassName"] == "local-path"
    holder = _leader(k3s)
    assert holder in {p["metadata"]["name"] for p in k3s.pods("controller")}, holder


def test_the_namespace_refuses_a_pod_that_violates_the_restricted_level(k3s: Install) -> None:
    assert k3s.kubectl_json("get", "namespace", NAMESPACE)["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"
    rogue = pod_manifest(k3s.node, "rogue", NAMESPACE, ["sleep", "3600"], restricted=False)
    refused = kubectl(k3s.node, "create", "-f", "-", stdin=json.dumps(rogue), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
    compliant = pod_manifest(k3s.node, "compliant", NAMESPACE, ["sleep", "3600"])
    kubectl(k3s.node, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(compliant))


def test_a_pod_resolves_the_broker_and_the_api_server_by_service_name(k3s: Install) -> None:
    pod = k3s.pods("controller")[0]
    for name in ("corral-mosquitto", f"corral-mosquitto.{NAMESPACE}.svc.cluster.local", "kubernetes.default"):
        resolved = exec_in(k3s.node, pod["metadata"]["name"], NAMESPACE, "python", "-c",
                           f"import socket; print(socket.gethostbyname({name!r}))").stdout.strip()
        service = "kubernetes" if name.startswith("kubernetes") else "corral-mosquitto"
        namespace = "default" if service == "kubernetes" else NAMESPACE
        cluster_ip = k3s.kubectl_json("get", "service", service, "-n", namespace)["spec"]["clusterIP"]
        assert resolved == cluster_ip, (name, resolved, cluster_ip)


def test_devices_an_agent_and_a_person_use_it_only_through_the_node_ports(k3s: Install) -> None:
    assert k3s.fleet is not None
    out = control(k3s, "desk-light", "power", "set_state", True, "desk-light-on", wait_s=30)
    assert out["code"] == "EXECUTED", out
    assert hardware_applies(k3s.fleet, "light-2") == [("power", True)]

    asked = control(k3s, "front-lock", "locked", "set_state", True, "lock-the-door")
    assert asked["code"] == "AWAITING_APPROVAL", asked
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(k3s.console_url + "/")
            page.get_by_label("Token").fill(k3s.token("alice"))
            page.get_by_role("button", name="Sign in").click()
            card = page.locator("article.card", has=page.get_by_role("link", name="front-lock (lock)"))
            card.get_by_role("button", name="Approve").click()
            card.get_by_role("button", name="Yes, approve").click()
            expect(page.locator("#detail .outcome [data-f=outcome]")).to_have_text("EXECUTED", timeout=30_000)
        finally:
            browser.close()
    assert intent_status(k3s, "lock-the-door", wait_s=10)["code"] == "EXECUTED"
    assert hardware_applies(k3s.fleet, "lock-1") == [("locked", True)]


def test_network_policies_keep_other_pods_off_the_broker_and_the_audit_server(k3s: Install) -> None:
    """By Pod address and by Service address. (A port a Service does not have is no test: this machine's network
    answers connections to addresses it does not know, so only ports kube-proxy translates are probed.)"""
    def addresses(component: str, service: str) -> list[str]:
        pod = k3s.pods(component)[0]
        return [pod["status"]["podIP"], k3s.kubectl_json("get", "service", service, "-n", NAMESPACE)["spec"]["clusterIP"]]

    controller = addresses("controller", "corral-controller")
    broker = addresses("mosquitto", "corral-mosquitto")
    gateway = addresses("gateway", "corral-gateway")
    other = "elsewhere"
    kubectl(k3s.node, "create", "namespace", other)
    try:
        # Corral's image as the client: Python's connect says plainly whether a port answers.
        client = pod_manifest(k3s.node, "client", other, ["sleep", "3600"])
        client["spec"]["containers"][0]["image"] = k3s.images["corral"].ref
        kubectl(k3s.node, "create", "-f", "-", stdin=json.dumps(client))
        wait_for(lambda: _ready(k3s.kubectl_json("get", "pod", "client", "-n", other)), "the client Pod Ready",
                 timeout_s=60, interval_s=0.3)

        def reaches(ip: str, port: int) -> bool:
            probe = f"import socket; socket.create_connection(({ip!r}, {port}), timeout=3).close()"
            return exec_in(k3s.node, "client", other, "python", "-c", probe, check=False).returncode == 0

        for ip in gateway:
            assert reaches(ip, 8000), f"a Pod of another namespace reaches the gateway at {ip} (requests need a token)"
        for ip in controller:
            assert not reaches(ip, 8443), f"the controller's audit server at {ip} is closed to other namespaces' Pods"
        for ip in broker:
            assert not reaches(ip, 8883), f"the broker at {ip} is closed to other namespaces' Pods"
    finally:
        kubectl(k3s.node, "delete", "namespace", other, "--wait=false", check=False)
    # ... and open from outside the Pod network, where the chart admits it: devices (the broker's node port, which
    # the fixture's devices use too) and the node itself (the API server's side of the audit server).
    with socket.create_connection((k3s.node.node_ip, MQTTS_PORT), timeout=3):
        pass
    with socket.create_connection((controller[0], 8443), timeout=3):
        pass


def _broker_pod(install: Install) -> dict[str, Any]:
    return _one_ready_pod(install, "mosquitto")


def _one_ready_pod(install: Install, component: str) -> dict[str, Any]:
    """The component's one Pod, once it is the only one and Ready (a rollout or a replacement has finished)."""
    def one_ready() -> dict[str, Any] | None:
        pods = install.pods(component)
        return pods[0] if len(pods) == 1 and _ready(pods[0]) else None
    pod = wait_for(one_ready, f"one {component} Pod Ready", timeout_s=120, interval_s=0.5)
    assert pod is not None
    return pod


def _controller_pods(install: Install) -> dict[str, dict[str, Any]]:
    """The controller's Pods by name, once there are REPLICAS and every one is Ready (a replacement has finished)."""
    def all_ready() -> dict[str, dict[str, Any]] | None:
        pods = install.pods("controller")
        return {p["metadata"]["name"]: p for p in pods} if len(pods) == REPLICAS and all(map(_ready, pods)) else None
    pods = wait_for(all_ready, f"{REPLICAS} controller Pods Ready", timeout_s=180, interval_s=0.5)
    assert pods is not None
    return pods


def _holder(install: Install) -> str:
    """The holderIdentity of the leader's Lease, "<pod>_<process id>" ("" while nobody holds it)."""
    lease = install.kubectl_json("get", "lease", LEADER_LEASE, "-n", NAMESPACE)
    return str(lease["spec"].get("holderIdentity") or "")


def _leader(install: Install) -> str:
    """The leader's Pod name, once someone leads."""
    holder = wait_for(lambda: _holder(install), f"a holder of Lease {LEADER_LEASE}", timeout_s=LEASE_S + 30,
                      interval_s=0.5)
    assert holder and "_" in holder, holder
    return holder.rsplit("_", 1)[0]


def _controller_status(pod: dict[str, Any]) -> dict[str, Any]:
    [status] = [s for s in pod["status"]["containerStatuses"] if s["name"] == "controller"]
    return status


def _requester(install: Install) -> tuple[Any, str]:
    """An API client as an agent of its own (ServiceAccount failover-agent, bound to corral-agent-operator as the
    README binds its agent), and its username: an Intent's requester must be its creator, and the controller asks
    the API server whether that user may write the device."""
    name = "failover-agent"
    if kubectl(install.node, "get", "serviceaccount", name, "-n", NAMESPACE, check=False).returncode != 0:
        install.run("kubectl", "create", "serviceaccount", name, "-n", NAMESPACE)
        install.run("kubectl", "create", "rolebinding", name, "--clusterrole", "corral-agent-operator",
                    "--serviceaccount", f"{NAMESPACE}:{name}", "-n", NAMESPACE)
    user = f"system:serviceaccount:{NAMESPACE}:{name}"
    wait_for(lambda: kubectl(install.node, "auth", "can-i", "write", "devices.corral.dev/desk-light", "--as", user,
                             "-n", NAMESPACE, check=False).stdout.strip() == "yes",
             f"{user} may write the desk light (its RoleBinding in effect)", timeout_s=30, interval_s=0.5)
    token = install.run("kubectl", "create", "token", name, "-n", NAMESPACE, "--duration", "1h").stdout.strip()
    admin = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(install.node.kubeconfig), client_configuration=admin)
    # Only the server and its CA from the admin's kubeconfig: a configuration loaded from it carries a hook that
    # puts the admin's own credentials back when it refreshes them, and the Intents would be the admin's.
    config = kubernetes.client.Configuration(host=admin.host, api_key={"authorization": f"Bearer {token}"})
    config.ssl_ca_cert = admin.ssl_ca_cert
    return kubernetes.client.ApiClient(config), user


class IntentStream:
    """Intents made one after the other on the API server (not through the gateway, which an upgrade restarts)
    while something is done to the controllers: each sets the desk light to a brightness of its own, so the
    simulated hardware says how often each one ran."""

    def __init__(self, install: Install, prefix: str, levels: list[int], pace_s: float = 0.5) -> None:
        self.install, self.prefix, self.levels, self.pace_s = install, prefix, levels, pace_s
        self.api, self.requester = _requester(install)
        self.sent: dict[int, float] = {}
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name=f"intents-{prefix}")

    def _run(self) -> None:
        for level in self.levels:
            spec = {"device": "desk-light", "actuator": "brightness", "action": "set_value",
                    "params": {"value": level}, "reason": "issue 31 failover", "requester": self.requester}
            try:
                at = time.monotonic()
                submit(self.api, NAMESPACE, f"{self.prefix}-{level}", spec)
                self.sent[level] = at
            except kubernetes.client.ApiException as err:
                self.errors.append(f"{self.prefix}-{level}: HTTP {err.status} {err.body}")
            except Exception as err:  # noqa: BLE001 - reported by the test
                self.errors.append(f"{self.prefix}-{level}: {err!r}")
            time.sleep(self.pace_s)  # a steady load, not a burst: one Intent every pace_s

    def __enter__(self) -> IntentStream:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.thread.join(300)

    def wait_sent(self, count: int) -> None:
        wait_for(lambda: len(self.sent) >= count or not self.thread.is_alive(), f"{count} Intents made",
                 timeout_s=60, interval_s=0.2)

    def each_ran_exactly_once(self, timeout_s: float = 60, offline_allowed: bool = False) -> dict[int, str]:
        """Every Intent ended EXECUTED, and the hardware set each level exactly once. With `offline_allowed`
        (the broker was away), an Intent may instead have ended DEVICE_GONE with nothing sent (then its level never
        reached the hardware), or TIMEOUT when the broker went away between command and ack (then at most once:
        the target stays set and is driven when the device is back). The final code of each level."""
        assert not self.errors, self.errors
        assert set(self.sent) == set(self.levels)
        ended = {level: (wait_settled(self.api, NAMESPACE, f"{self.prefix}-{level}", timeout_s, poll_s=0.5)
                         .get("status") or {}) for level in self.levels}
        gone = {level for level, s in ended.items() if offline_allowed and s.get("code") == "DEVICE_GONE"
                and "nothing was sent" in (s.get("message") or "")}
        unsure = {level for level, s in ended.items() if offline_allowed and s.get("code") == "TIMEOUT"
                  and "did not acknowledge" in (s.get("message") or "")}
        assert all(s.get("code") == "EXECUTED" for level, s in ended.items() if level not in gone | unsure), {
            level: (round(self.sent[level] - self.started, 1), s.get("code"), s.get("message"))
            for level, s in ended.items() if s.get("code") != "EXECUTED"}
        assert self.install.fleet is not None
        ran = Counter(v for a, v in hardware_applies(self.install.fleet, "light-2") if a == "brightness")
        wrong = {lv: ran[lv] for lv in self.levels
                 if ran[lv] != (0 if lv in gone else 1) and not (lv in unsure and ran[lv] <= 1)}
        assert not wrong, f"lost or executed twice (offline, nothing sent: {sorted(gone)}; unacknowledged: " \
                          f"{sorted(unsure)}): {wrong} of {dict(ran)}"
        return {level: str(s.get("code")) for level, s in ended.items()}


def _epochs_until(install: Install, at: float) -> set[int | None]:
    return {d.epoch for d in install.spy.seen() if d.at <= at}


def _new_leader_acted_at(install: Install, since: float, old: set[int | None]) -> float:
    """When the first command of a new holder reached a device: a later epoch than any before `since` (or, for a
    controller that sends none, the first command after `since`)."""
    newest = max((e for e in old if e is not None), default=None)

    def first() -> float | None:
        return next((d.at for d in install.spy.seen() if d.at > since
                     and (newest is None or (d.epoch is not None and d.epoch > newest))), None)
    acted = wait_for(first, "a command from the new leader at a device", timeout_s=LEASE_S + 30, interval_s=0.2)
    assert acted is not None
    return acted


def _no_command_under_two_epochs(install: Install) -> None:
    twice = install.spy.ids_under_two_epochs()
    assert not twice, f"command ids sent by two holders: {twice}"


def _resent_only_by_the_successor(install: Install, old: set[int | None]) -> None:
    """After a leader died without a goodbye (SIGKILL, SIGSTOP), a command it sent whose Intent it did not live to
    end is sent again by its successor under the same id: nobody can know whether the first one arrived. That is
    a redelivery, not a second command: the firmware answers it from its stored ack (the hardware counts in
    each_ran_exactly_once prove it acted once). What must never be: an id under two epochs of which the later is
    not the successor's, or under three."""
    twice = install.spy.ids_under_two_epochs()
    for command_id, epochs in twice.items():
        assert len(epochs) == 2 and None not in epochs, f"{command_id} under epochs {epochs}"
        first, then = sorted(e for e in epochs if e is not None)
        assert first in old and then not in old, f"{command_id} resent by a holder other than the successor: {epochs}"
    install.say(f"{len(twice)} command id(s) of the dead leader resent by its successor (answered from the ack cache)")


def test_a_deleted_leader_pod_hands_over_within_the_lease_and_its_chain_continues_on_its_volume(k3s: Install) -> None:
    """The leader's Pod is deleted with Intents flowing: the other replica leads and acts within the lease
    duration plus 5 s, every Intent runs exactly once, no command went out under two epochs, and the
    StatefulSet's new Pod of the same name continues its own chain on its own volume."""
    assert k3s.fleet is not None
    pods = _controller_pods(k3s)
    leader, holder = _leader(k3s), _holder(k3s)
    first_seq, last_before = audit_range(k3s, leader)
    with IntentStream(k3s, "delete", list(range(11, 23))) as stream:
        stream.wait_sent(3)
        deleted_at = time.monotonic()
        kubectl(k3s.node, "delete", "pod", leader, "-n", NAMESPACE, "--wait=false")
        acted_at = _new_leader_acted_at(k3s, deleted_at, _epochs_until(k3s, deleted_at))
    k3s.say(f"leader Pod deleted: a new holder acted after {acted_at - deleted_at:.1f}s (lease {LEASE_S}s)")
    assert acted_at - deleted_at <= LEASE_S + 5
    assert _holder(k3s) != holder
    stream.each_ran_exactly_once()
    _no_command_under_two_epochs(k3s)
    after = _controller_pods(k3s)
    assert after[leader]["metadata"]["uid"] != pods[leader]["metadata"]["uid"], "a new Pod of the same name"
    assert _claims(after[leader]) == _claims(pods[leader]) == {f"audit-{leader}"}
    first_after, last_after = audit_range(k3s, leader)
    assert first_after == first_seq and last_after >= last_before, "the new Pod continued the chain on its volume"


def _claims(pod: dict[str, Any]) -> set[str]:
    return {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}


def _container_pid(install: Install, container_id: str) -> int:
    listed = subprocess.run(install.node.ctr_argv("tasks", "ls"), capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container_id:
            return int(pid)
    raise AssertionError(f"containerd runs no task {container_id}:\n{listed}")


def _leader_process(install: Install) -> tuple[str, dict[str, Any], int]:
    """The leader's Pod name, its controller container's status and that container's process id on the node."""
    pods = _controller_pods(install)
    leader = _leader(install)
    status = _controller_status(pods[leader])
    return leader, status, _container_pid(install, status["containerID"].split("://", 1)[1])


def test_a_killed_leader_process_hands_over_within_the_lease_and_restarts_as_a_follower(k3s: Install) -> None:
    leader, status, pid = _leader_process(k3s)
    holder = _holder(k3s)
    with IntentStream(k3s, "kill", list(range(23, 35))) as stream:
        stream.wait_sent(3)
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # no goodbye: the Lease is not released, the others wait out its duration
        acted_at = _new_leader_acted_at(k3s, killed_at, _epochs_until(k3s, killed_at))
    k3s.say(f"leader process killed: a new holder acted after {acted_at - killed_at:.1f}s (lease {LEASE_S}s)")
    assert acted_at - killed_at <= LEASE_S + 5
    assert _holder(k3s) != holder
    stream.each_ran_exactly_once()
    _resent_only_by_the_successor(k3s, _epochs_until(k3s, killed_at))

    def restarted() -> dict[str, Any] | None:
        now = k3s.kubectl_json("get", "pod", leader, "-n", NAMESPACE)
        return now if _controller_status(now)["restartCount"] == status["restartCount"] + 1 and _ready(now) else None

    again = wait_for(restarted, "the killed controller container restarted and Ready", timeout_s=120, interval_s=0.5)
    assert again is not None
    for pod in _controller_pods(k3s):
        audit_range(k3s, pod)


def test_a_leader_stopped_past_its_renew_deadline_sends_nothing_after_it_and_resumes_as_a_follower(
        k3s: Install) -> None:
    """SIGSTOP the leader's process until another replica holds the Lease (past its renew deadline and its
    lease), then SIGCONT it: no command of its epoch reaches a device after its deadline, every hardware action
    after the deadline followed a command of the new holder, and it goes on as a follower in the same process."""
    assert k3s.fleet is not None
    leader, status, pid = _leader_process(k3s)
    holder = _holder(k3s)
    with IntentStream(k3s, "stop", list(range(60, 72))) as stream:
        stream.wait_sent(3)
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _holder(k3s) not in ("", holder), "another replica to take the Lease",
                     timeout_s=LEASE_S + 30, interval_s=0.5)
            wait_for(lambda: time.monotonic() > stopped_at + RENEW_S + 1 and
                     any(d.at > stopped_at for d in k3s.spy.seen()), "the new holder to command a device",
                     timeout_s=LEASE_S + 30, interval_s=0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
            resumed_at = time.monotonic()
        k3s.say(f"leader stopped for {resumed_at - stopped_at:.1f}s (renew deadline {RENEW_S}s)")
    stream.each_ran_exactly_once()
    # Its own chance to misbehave: a few renew periods after it woke, as a stale leader would have acted at once.
    probe = IntentStream(k3s, "after-stop", [75], pace_s=0)
    with probe:
        pass
    probe.each_ran_exactly_once()
    deadline = stopped_at + RENEW_S + 1  # + 1: a command sent just before the deadline is still on its way
    old = _epochs_until(k3s, stopped_at) - {None}
    late = [d for d in k3s.spy.seen() if d.epoch in old and d.at > deadline]
    assert not late, f"the stopped leader's epoch reached devices after its deadline: {late}"
    delivered = [d for d in k3s.spy.seen() if d.device_id == "light-2"]
    for _actuator, value, at in hardware_applies_at(k3s.fleet, "light-2"):
        if at > deadline:
            cause = [d for d in delivered if d.at <= at][-1]
            assert cause.epoch not in old, f"brightness {value} at {at:.1f} came from the stopped leader: {cause}"
    _resent_only_by_the_successor(k3s, _epochs_until(k3s, stopped_at))
    # A follower now: the same process (no restart), Ready, and the Lease stays with the other replica.
    now_holder = _holder(k3s)
    assert now_holder and not now_holder.startswith(f"{leader}_"), now_holder
    # (Its readiness probe failed while it was stopped: Ready again once it answers.)
    def ready_again() -> dict[str, Any] | None:
        pod = k3s.kubectl_json("get", "pod", leader, "-n", NAMESPACE)
        return pod if _ready(pod) else None

    now = wait_for(ready_again, f"{leader} Ready again", timeout_s=60, interval_s=0.5)
    assert now is not None and _controller_status(now)["restartCount"] == status["restartCount"]
    assert _container_pid(k3s, status["containerID"].split("://", 1)[1]) == pid, "the same process, resumed"


def test_helm_upgrade_to_a_new_image_under_intents_loses_none_runs_none_twice_and_keeps_the_budget(
        k3s: Install) -> None:
    pods = _controller_pods(k3s)
    broker = _broker_pod(k3s)
    ranges = {name: audit_range(k3s, name) for name in pods}
    newer = ensure_images(k3s.say, names=["corral"], corral_version=UPGRADE_VERSION)["corral"]
    import_images(str(k3s.node.ctr), k3s.node.containerd_socket, [newer], k3s.say)
    assert newer.ref != k3s.images["corral"].ref
    tag = newer.ref.rsplit(":", 1)[1]
    ready_counts: list[int] = []
    rolling = threading.Event()

    def watch_budget() -> None:  # how many controller Pods were Ready, all through the roll
        while not rolling.is_set():
            ready_counts.append(sum(1 for p in k3s.pods("controller") if _ready(p)))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch_budget, name="budget")
    watcher.start()
    try:
        with IntentStream(k3s, "upgrade", list(range(76, 100)), pace_s=2.0) as stream:
            stream.wait_sent(2)
            k3s.run("helm", "upgrade", RELEASE, "charts/corral", "-n", NAMESPACE, "--reuse-values", "--set",
                    f"image.tag={tag}", "--wait", "--timeout", "10m", timeout_s=700)
    finally:
        rolling.set()
        watcher.join(10)
    assert ready_counts and min(ready_counts) >= REPLICAS - 1, f"Ready controller Pods during the roll: {ready_counts}"
    assert sum(1 for p in k3s.pods("controller") if _ready(p)) == REPLICAS
    # The bundled broker's Pod runs `corral broker init-dynsec` from the corral image, so a new image tag replaces
    # it too (Recreate): for those seconds the devices are offline, and an Intent made then ends DEVICE_GONE with
    # nothing sent, or TIMEOUT if the broker went between its command and the ack (docs/scale.md, "Upgrades").
    # None is lost (each ends, and says what happened), none runs twice.
    replaced = broker["metadata"]["uid"] != _broker_pod(k3s)["metadata"]["uid"]
    codes = stream.each_ran_exactly_once(offline_allowed=replaced)
    k3s.say(f"helm upgrade under {len(codes)} Intents: {sum(c == 'EXECUTED' for c in codes.values())} EXECUTED, "
            f"{sum(c == 'DEVICE_GONE' for c in codes.values())} DEVICE_GONE and "
            f"{sum(c == 'TIMEOUT' for c in codes.values())} TIMEOUT while the broker restarted; "
            f"Ready controller Pods through the roll: min {min(ready_counts)} of {REPLICAS}")
    _no_command_under_two_epochs(k3s)
    for component in ("gateway", "console"):
        pod = _one_ready_pod(k3s, component)
        assert {c["image"] for c in pod["spec"]["containers"]} == {newer.ref}, component
    for name, pod in _controller_pods(k3s).items():
        assert {c["image"] for c in pod["spec"]["containers"]} == {newer.ref}, name
        first_after, last_after = audit_range(k3s, name)
        assert first_after == ranges[name][0] and last_after >= ranges[name][1], f"{name}: its own chain goes on"
    out = control(k3s, "desk-light", "brightness", "set_value", 50, "after-upgrade", wait_s=30)
    assert out["code"] == "EXECUTED", out


def test_uninstall_leaves_what_the_readme_says_and_installs_again_under_both_names(k3s: Install) -> None:
    k3s.run("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m", timeout_s=400)
    cluster_scoped = ("Namespace", "CustomResourceDefinition", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding")
    expected = {(kind, name) for kind, name in uninstall_leaves() if kind not in cluster_scoped}
    # What the controller's ServiceAccount owned goes a few seconds after it, with Kubernetes' garbage collector.
    seen: list[set[tuple[str, str]]] = []

    def as_documented() -> bool:
        seen.append(_release_objects(k3s))
        return seen[-1] == expected

    try:
        wait_for(as_documented, "what helm uninstall leaves to be what the chart README says", timeout_s=60,
                 interval_s=1)
    except AssertionError:
        raise AssertionError(f"after helm uninstall: left {sorted(seen[-1])}, the README says {sorted(expected)}") from None
    assert k3s.kubectl_json("get", "namespace", "corral-people")["metadata"]["name"] == "corral-people"

    install_line = next(c for c in k3s_install_commands(k3s.node.node_ip, k3s.helm_sets) if c.startswith("helm install"))
    for release in (RELEASE, "corral-again"):
        line = install_line.replace(f"helm install {RELEASE} ", f"helm install {release} ", 1).replace(
            "$NODE", k3s.node.node_ip)
        done = k3s.run("bash", "-c", line, check=False, timeout_s=700)
        assert done.returncode == 0, f"helm install {release} after an uninstall:\n{done.stdout}\n{done.stderr}"
        pods = k3s.pods(release=release)
        assert pods and all(_ready(p) for p in pods), release
        k3s.run("helm", "uninstall", release, "-n", NAMESPACE, "--wait", "--timeout", "5m", timeout_s=400)


def _release_objects(install: Install) -> set[tuple[str, str]]:
    """What the release made (Helm or its init container, both label it as the release's) still in its namespace."""
    kinds = "deployments,services,configmaps,secrets,persistentvolumeclaims,serviceaccounts,roles,rolebindings"
    listed = install.kubectl_json("get", kinds, "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")
    return {(o["kind"], o["metadata"]["name"]) for o in listed["items"]}
