"""What both demos (`corral demo` on the local plane, `corral demo --node` on the real node) do the same way: run
Corral's commands as children, sign the catalog's firmware, enroll the simulated home, mint the agent's token and
wait for the devices to come online."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import kubernetes

from corral.api.codes import GATEWAY_AUDIENCE, GROUP, VERSION
from corral.client import enroll as enrollment
from corral.client import signing
from corral.devcluster.errors import DevClusterError
from corral.devices.credentials import write_credentials
from corral.gateway.identity import Caller, anonymous
from corral.privatefile import write_private
from corral_sim.fleet import DeviceSpec

SIGNING_KEY_FILE = "contract-signing-key.pem"  # the demo's vendor key (in the state directory, 0600)
SIGNING_KEYS_SECRET = "corral-signing-keys"  # the trusted public keys, in the demo's namespace (the chart's name too)
Progress = Callable[[str], None]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


def spawn_corral(name: str, args: list[str], env: dict[str, str], logs: Path) -> Child:
    """`corral ARGS...` of this interpreter, its output in LOGS/NAME.log."""
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "corral.cli.main", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Child(name, proc, log)


def check_children(children: list[Child]) -> None:
    for child in children:
        if child.proc.poll() is not None:
            tail = "\n".join(child.log.read_text(errors="replace").splitlines()[-15:])
            raise DevClusterError(f"the {child.name} exited with {child.proc.returncode} (log {child.log}):\n{tail}")


def stop_uninterrupted(children: list[Child], progress: Progress) -> None:
    """stop_children, with a second Ctrl-C (or SIGTERM) ignored from here on: it must not cut the clean-up short
    and leave processes (or a half-removed node) behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_children(children, progress)


def stop_children(children: list[Child], progress: Progress) -> None:
    """SIGTERM to all, newest first, then wait for each (killed after 20 s)."""
    for child in reversed(children):
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    for child in reversed(children):
        try:
            child.proc.wait(20)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait(5)
        progress(f"stopped the {child.name}")
    children.clear()


def enroll(admin: kubernetes.client.ApiClient, namespace: str, devices: list[DeviceSpec], path: Path,
           progress: Progress) -> Path:
    """Enroll the simulated home as a person would (`corral devices enroll`): a Device and a credential each; the
    controller gives each its broker account. Enrollments kept from an earlier run are reused. The passwords go
    to PATH (0600), for the simulator."""
    progress(f"enrolling the {len(devices)} simulated devices in namespace {namespace} "
             "(a Device and a broker credential each, as `corral devices enroll` makes them)")
    passwords = {spec.device_id: enrollment.ensure_enrolled(admin, namespace, spec.device_id,
                                                            spec.device_type).password for spec in devices}
    write_credentials(path, passwords)
    return path


def sign_firmware(admin: kubernetes.client.ApiClient, state_dir: Path, namespace: str,
                  progress: Progress) -> tuple[Path, str]:
    """What a vendor's build step does (`corral contracts keygen`, `corral contracts sign`): a signing key kept
    in the state directory (0600, reused by the next run), the catalog's contracts signed with it for the
    simulated firmware, and its public half in the Secret of trusted keys. The controller then requires
    signatures, as the chart does by default. Returns the signed build and the Secret (NAMESPACE/NAME)."""
    try:
        key = signing.ensure_key(state_dir / SIGNING_KEY_FILE)
        build = state_dir / "signed-contracts.json"
        signing.write_build(build, signing.sign_types([], key))
        signing.trust_key(admin, namespace, SIGNING_KEYS_SECRET, "demo", key, replace=True)  # its own entry
    except signing.SigningError as err:
        raise DevClusterError(f"signing the catalog's contracts: {err}") from None
    progress(f"signed the catalog's contracts ({build}) with {state_dir / SIGNING_KEY_FILE}, trusted "
             f"in Secret {namespace}/{SIGNING_KEYS_SECRET}")
    return build, f"{namespace}/{SIGNING_KEYS_SECRET}"


def agent_token(admin: kubernetes.client.ApiClient, namespace: str, service_account: str, path: Path) -> Path:
    """A day's token of the ServiceAccount for the gateway's audience, in PATH (0600): over HTTP the gateway accepts
    no other (`kubectl create token SA --audience corral-gateway`)."""
    request = {"spec": {"audiences": [GATEWAY_AUDIENCE], "expirationSeconds": 86400}}
    token = kubernetes.client.CoreV1Api(admin).create_namespaced_service_account_token(
        service_account, namespace, request).status.token
    _check_audience(admin, token)
    write_private(path, token)
    return path


def _check_audience(admin: kubernetes.client.ApiClient, token: str) -> None:
    """The API server must accept tokens for the gateway's audience too (every call the gateway makes for an
    agent carries the agent's token): say so now, not as a 401 to every agent."""
    with Caller("demo-agent", anonymous(admin.configuration), token).new_client() as client:
        try:
            kubernetes.client.AuthenticationV1Api(client).create_self_subject_review({})
        except kubernetes.client.ApiException as err:
            if err.status != 401:
                raise
            raise DevClusterError(
                f"the cluster's API server refuses tokens for the audience {GATEWAY_AUDIENCE}, the only ones the "
                f"MCP gateway accepts: add it to the API server's --api-audiences, keeping the ones it has (k3s: "
                f"--kube-apiserver-arg=api-audiences=https://kubernetes.default.svc.cluster.local,k3s,"
                f"{GATEWAY_AUDIENCE})") from None


def wait_online(admin: kubernetes.client.ApiClient, namespace: str, expected: int, progress: Progress,
                check: Callable[[], None], timeout_s: float = 120) -> None:
    """Until EXPECTED Devices of the namespace are online with their capability; `check` raises if a child died."""
    objects = kubernetes.client.CustomObjectsApi(admin)
    last = [-1]

    def registered() -> bool:
        check()
        items = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "devices")["items"]
        ready = sum(1 for i in items if (i.get("status") or {}).get("online") and (i.get("status") or {}).get("capability"))
        if ready != last[0]:
            progress(f"enrolled devices online: {ready}/{expected}")
            last[0] = ready
        return ready >= expected

    wait_until(registered, "every simulated device to come online", timeout_s, interval_s=1.0)


def wait_until(probe: Callable[[], bool], what: str, timeout_s: float, interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise DevClusterError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
