"""Corral's chart on the real node, installed as a k3s user installs it (issue 28's acceptance).

The install is the chart README's own block ("Install on k3s", read back by tests/chart_readme.py), run by bash in
a directory of its own with the images built here named as that README says. Devices, an agent and a person then
reach the product only through the node's ports, as they would at home: a light and a lock of Corral's firmware
(in this process, so their simulated hardware can be read) over MQTT with TLS to the broker's node port, an MCP
client to the gateway's, a browser to the approval page's. The tests share one install and run in file order:
what they do to it (a deleted Pod, a killed process, an upgrade) comes after what only reads it, and the last test
uninstalls and installs again.
"""

from __future__ import annotations

import asyncio
import base64
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

import pytest
from playwright.sync_api import expect, sync_playwright

from corral.client.signing import firmware_contracts
from corral.devcluster.images import NodeImage, ensure_images, import_images
from corral.devcluster.node import NodePlane
from corral.devcluster.nodedemo import image_values
from corral.devcluster.processes import free_port
from corral.devices.credentials import read_credentials
from corral_sim.fleet import Broker, DeviceSpec, Fleet, FleetOptions
from tests.chart_readme import k3s_install_commands, uninstall_leaves
from tests.fleet_harness import hardware_applies
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

    def say(line: str) -> None:
        if reporter is not None:
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
    helm_sets = image_values({name: image.ref for name, image in images.items()})
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
        with _lock_and_light(install) as fleet:
            install.fleet = fleet
            yield install
    finally:
        _stop_group(readme.pid)
        log.close()
        kubectl(node, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


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
def _port_forward(install: Install) -> Iterator[int]:
    port = free_port()
    forward = subprocess.Popen(install.node.kubectl_argv("port-forward", "-n", NAMESPACE, "svc/corral-controller",
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


def audit_range(install: Install) -> tuple[int, int]:
    """`corral audit verify` against the controller's log (its key taken at install): passes, or the test fails;
    the first and last sequence numbers it checked."""
    ca = install.kubectl_json("get", "configmap", "corral-controller-serving-ca", "-n", NAMESPACE)["data"]["ca.crt"]
    (install.work / "ca.crt").write_text(ca)
    token = install.run("kubectl", "create", "token", "auditor", "-n", NAMESPACE).stdout.strip()
    token_file = install.work / "auditor.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    with _port_forward(install) as port:
        done = install.run(str(CORRAL_BIN / "corral"), "audit", "verify", "--server", f"https://localhost:{port}",
                           "--ca-file", "ca.crt", "--token-file", str(token_file), "--key",
                           str(install.controller_key), "--checkpoint-object", f"{NAMESPACE}/corral-controller",
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
    for component in CORRAL_COMPONENTS:
        [pod] = k3s.pods(component)
        name = pod["metadata"]["name"]
        assert exec_in(k3s.node, name, NAMESPACE, "id", "-u").stdout.strip() == "10001"
        wrote = exec_in(k3s.node, name, NAMESPACE, "touch", "/written-by-a-test", check=False)
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, (component, wrote)
    [broker] = k3s.pods("mosquitto")
    assert exec_in(k3s.node, broker["metadata"]["name"], NAMESPACE, "id", "-u").stdout.strip() == "1883"
    claim = k3s.kubectl_json("get", "pvc", "corral-controller-audit", "-n", NAMESPACE)
    assert claim["status"]["phase"] == "Bound" and claim["spec"]["storageClassName"] == "local-path"


def test_the_namespace_refuses_a_pod_that_violates_the_restricted_level(k3s: Install) -> None:
    assert k3s.kubectl_json("get", "namespace", NAMESPACE)["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"
    rogue = pod_manifest(k3s.node, "rogue", NAMESPACE, ["sleep", "3600"], restricted=False)
    refused = kubectl(k3s.node, "create", "-f", "-", stdin=json.dumps(rogue), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
    compliant = pod_manifest(k3s.node, "compliant", NAMESPACE, ["sleep", "3600"])
    kubectl(k3s.node, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(compliant))


def test_a_pod_resolves_the_broker_and_the_api_server_by_service_name(k3s: Install) -> None:
    [pod] = k3s.pods("controller")
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
        [pod] = k3s.pods(component)
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


def _one_ready_pod(install: Install, component: str) -> dict[str, Any]:
    """The component's one Pod, once it is the only one and Ready (a rollout or a replacement has finished)."""
    def one_ready() -> dict[str, Any] | None:
        pods = install.pods(component)
        return pods[0] if len(pods) == 1 and _ready(pods[0]) else None
    pod = wait_for(one_ready, f"one {component} Pod Ready", timeout_s=120, interval_s=0.5)
    assert pod is not None
    return pod


def _controller_pod(install: Install) -> dict[str, Any]:
    return _one_ready_pod(install, "controller")


def test_a_deleted_controller_pod_is_replaced_and_continues_the_audit_chain_on_its_volume(k3s: Install) -> None:
    assert k3s.fleet is not None
    first_seq, last_before = audit_range(k3s)
    old = _controller_pod(k3s)
    levels = list(range(11, 23))
    sent: dict[int, float] = {}
    deleted_at: list[float] = []
    stop = threading.Event()

    def stream() -> None:
        for level in levels:
            if stop.is_set():
                return
            asked_at = time.monotonic()
            try:
                control(k3s, "desk-light", "brightness", "set_value", level, f"level-{level}")
                sent[level] = asked_at
            except Exception as err:  # noqa: BLE001 - reported by the test thread
                k3s.stream_errors.append(f"level {level}: {err!r}")
            if len(sent) == 3 and not deleted_at:
                kubectl(k3s.node, "delete", "pod", old["metadata"]["name"], "-n", NAMESPACE, "--wait=false")
                deleted_at.append(time.monotonic())

    agent = threading.Thread(target=stream, name="agent-stream")
    agent.start()
    try:
        new = wait_for(lambda: next((p for p in k3s.pods("controller") if _ready(p)
                                     and p["metadata"]["uid"] != old["metadata"]["uid"]), None),
                       "a new controller Pod Ready", timeout_s=180, interval_s=0.5)
        assert new is not None
        replaced_at = time.monotonic()
    finally:
        agent.join(300)
        stop.set()
    assert not k3s.stream_errors, k3s.stream_errors
    assert deleted_at, "the controller Pod was never deleted"
    during = [level for level, at in sent.items() if deleted_at[0] <= at <= replaced_at]
    assert during, "no request went in while the controller Pod was gone: the deletion was not mid-stream"
    for level in levels:
        assert intent_status(k3s, f"level-{level}", wait_s=30)["code"] == "EXECUTED", level
    brightness = Counter(v for a, v in hardware_applies(k3s.fleet, "light-2") if a == "brightness")
    assert set(brightness) == set(levels) and set(brightness.values()) == {1}, f"executed twice or lost: {brightness}"
    assert _claims(new) == _claims(old) == {"corral-controller-audit"}
    first_after, last_after = audit_range(k3s)
    assert first_after == first_seq and last_after > last_before, "the new Pod continued the chain on the same volume"


def _claims(pod: dict[str, Any]) -> set[str]:
    return {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}


def _container_pid(install: Install, container_id: str) -> int:
    listed = subprocess.run(install.node.ctr_argv("tasks", "ls"), capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container_id:
            return int(pid)
    raise AssertionError(f"containerd runs no task {container_id}:\n{listed}")


def test_a_killed_controller_process_is_restarted_by_the_kubelet_in_the_same_pod(k3s: Install) -> None:
    pod = _controller_pod(k3s)
    [status] = [s for s in pod["status"]["containerStatuses"] if s["name"] == "controller"]
    before = status["restartCount"]
    os.kill(_container_pid(k3s, status["containerID"].split("://", 1)[1]), signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        now = k3s.kubectl_json("get", "pod", pod["metadata"]["name"], "-n", NAMESPACE)
        [s] = [s for s in now["status"]["containerStatuses"] if s["name"] == "controller"]
        return now if s["restartCount"] == before + 1 and _ready(now) else None

    again = wait_for(restarted, "the controller container restarted and Ready", timeout_s=120, interval_s=0.5)
    assert again is not None
    assert again["metadata"]["uid"] == pod["metadata"]["uid"], "the same Pod, not a new one"
    out = control(k3s, "desk-light", "brightness", "set_value", 40, "after-kill", wait_s=30)
    assert out["code"] == "EXECUTED", out
    audit_range(k3s)


def test_helm_upgrade_to_a_new_image_rolls_the_workloads_and_the_audit_chain_continues(k3s: Install) -> None:
    first_seq, last_before = audit_range(k3s)
    newer = ensure_images(k3s.say, names=["corral"], corral_version=UPGRADE_VERSION)["corral"]
    import_images(str(k3s.node.ctr), k3s.node.containerd_socket, [newer], k3s.say)
    assert newer.ref != k3s.images["corral"].ref
    tag = newer.ref.rsplit(":", 1)[1]
    k3s.run("helm", "upgrade", RELEASE, "charts/corral", "-n", NAMESPACE, "--reuse-values", "--set",
            f"image.tag={tag}", "--wait", "--timeout", "10m", timeout_s=700)
    for component in CORRAL_COMPONENTS:
        pod = _one_ready_pod(k3s, component)
        assert {c["image"] for c in pod["spec"]["containers"]} == {newer.ref}, component
    out = control(k3s, "desk-light", "brightness", "set_value", 50, "after-upgrade", wait_s=30)
    assert out["code"] == "EXECUTED", out
    first_after, last_after = audit_range(k3s)
    assert first_after == first_seq and last_after > last_before


def test_uninstall_leaves_what_the_readme_says_and_installs_again_under_both_names(k3s: Install) -> None:
    k3s.run("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m", timeout_s=400)
    expected = {(kind, name) for kind, name in uninstall_leaves() if kind not in ("Namespace", "CustomResourceDefinition")}
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
