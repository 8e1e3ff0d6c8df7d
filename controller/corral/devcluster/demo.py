"""`corral demo`: the whole product on one machine, started in order and stopped in reverse.

Control plane and broker (the local plane, or `--kubeconfig` for an existing cluster with a private
Mosquitto), CRDs and admission policies, the user roles, the simulated home, the controller and the
MCP gateway. Only what the demo started is stopped: a plane that was already running stays up.

The simulator, controller and gateway run in the demo's own process group: a Ctrl-C at a terminal reaches
them too (each stops cleanly on it), and whoever started the demo can stop all of it by that group. The
plane outlives a killed demo (it runs detached, like `corral dev up`'s); `stop()` ends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import kubernetes
import yaml

from corral.api.codes import GATEWAY_AUDIENCE, GROUP, VERSION
from corral.api.roles import user_roles
from corral.client import enroll as enrollment
from corral.client import signing
from corral.client.apply import apply_yaml
from corral.client.install import install_api
from corral.devcluster import broker, files
from corral.devcluster.errors import DevClusterError
from corral.devcluster.naming import name_devices
from corral.devcluster.plane import DevPlane, find_mosquitto
from corral.devcluster.processes import accepts_connections, child_environment, free_port, port_is_free
from corral.devcluster.readings_api import register_readings_api, unregister_readings_api
from corral.devices.credentials import write_credentials
from corral.gateway.identity import Caller, anonymous
from corral.privatefile import write_private
from corral_sim.fleet import DeviceSpec
from corral_sim.presets import overlay_of, preset

FIELD_MANAGER = "corral-demo"
AUDIT_PORT = 8443  # the audit log reader, as the README shows it (another port when 8443 is taken)
SIGNING_KEY_FILE = "contract-signing-key.pem"  # the demo's vendor key (in the state directory, 0600)
SIGNING_KEYS_SECRET = "corral-signing-keys"  # the trusted public keys, in the demo's namespace
Progress = Callable[[str], None]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass(frozen=True)
class BrokerAt:
    """The broker: as the controller connects (its account's name in the URL, the password in a file) and where
    devices connect (with their own accounts)."""

    controller_url: str
    device_url: str
    controller_password_file: Path | None = None
    # The broker's debug log, where it names the PUBLISHes it refused (a broker the demo or the plane runs).
    debug_log: Path | None = None

    @classmethod
    def of(cls, url: str, password_file: Path | None = None) -> BrokerAt:
        parts = urlsplit(url)
        address = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        return cls(url, urlunsplit(parts._replace(netloc=address)), password_file)

    def controller_args(self) -> list[str]:
        return ["--mqtt", self.controller_url, *(["--mqtt-password-file", str(self.controller_password_file)]
                                                 if self.controller_password_file is not None else []),
                *(["--broker-log", str(self.debug_log)] if self.debug_log is not None else [])]


@dataclass
class Ready:
    kubeconfig: Path
    namespace: str
    mqtt_url: str
    gateway_url: str
    token_file: Path
    devices: int
    own_plane: bool


@dataclass
class Demo:
    state_dir: Path
    progress: Progress
    kubeconfig: Path | None = None
    mqtt_url: str | None = None  # the controller's account by name; its password in mqtt_password_file
    namespace: str = "home"
    gateway_port: int = 8000
    children: list[Child] = field(default_factory=list)
    _plane: DevPlane | None = None
    _readings_api: kubernetes.client.ApiClient | None = None  # registered the APIService with this client
    mqtt_password_file: Path | None = None

    # ---- start -----------------------------------------------------------------------------------------------

    def start(self) -> Ready:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # the agent's token, the devices' passwords and the audit keys are in here
        logs = self.state_dir / "demo-logs"
        logs.mkdir(exist_ok=True)
        kubeconfig, broker_at, own_plane = self._cluster_and_broker(logs)
        admin = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        self.progress("installing CRDs, admission policies and user roles")
        self._install(admin)
        token_file = self._agent_token(admin)
        devices = preset("home")
        credentials = self._enroll(admin, devices)
        name_devices(admin, self.namespace, overlay_of("home"), FIELD_MANAGER)  # "Front door" in the "Hallway"
        signed_build, signing_keys = self._sign_firmware(admin)
        env = child_environment(os.environ, KUBECONFIG=str(kubeconfig))
        self.progress(f"starting {len(devices)} simulated devices, the controller and the MCP gateway")
        self._spawn("sim", ["sim", "--preset", "home", "--mqtt", broker_at.device_url, "--credentials",
                            str(credentials), "--signed-contracts", str(signed_build)], env, logs)
        health = free_port()
        audit_port = AUDIT_PORT if port_is_free(AUDIT_PORT) else free_port()
        self.progress(f"the audit log: corral audit show --server https://127.0.0.1:{audit_port} --ca-file "
                      f"{self.state_dir / 'audit-keys' / 'serving-ca.crt'} (files in {self.state_dir / 'audit'})")
        # On the local plane the readings are an aggregated API too: the controller believes its front proxy.
        front_proxy = self._front_proxy_ca()
        self._spawn("controller", ["run", *broker_at.controller_args(), "--watch-namespace", self.namespace,
                                   "--health-port", str(health), "--serve-port", str(audit_port),
                                   "--audit-dir", str(self.state_dir / "audit"),
                                   "--audit-checkpoint", f"{self.namespace}/corral-controller",
                                   "--audit-key", str(self.state_dir / "audit-keys" / "controller.pem"),
                                   "--require-signatures", "--signing-keys", signing_keys,
                                   *(["--requestheader-client-ca-file", str(front_proxy)] if front_proxy else [])],
                    env, logs)
        serving_ca = self.state_dir / "audit-keys" / "serving-ca.crt"
        # Readings straight from the controller's server, as the caller (its CA is read at the first call).
        self._spawn("gateway", ["mcp", "--transport", "http", "-n", self.namespace, "--port",
                                str(self.gateway_port), "--audit-dir", str(self.state_dir / "gateway-audit"),
                                "--audit-key", str(self.state_dir / "audit-keys" / "gateway.pem"),
                                "--readings-url", f"https://127.0.0.1:{audit_port}", "--readings-ca", str(serving_ca)],
                    env, logs)
        self._wait_healthy("controller", f"http://127.0.0.1:{health}/healthz")
        if front_proxy is not None:
            self._readings_api = admin  # removed again on stop, even if it never became available
            try:
                register_readings_api(admin, audit_port, serving_ca.read_bytes())
                self.progress("readings: kubectl get --raw /apis/readings.corral.dev/v1alpha1/namespaces/"
                              f"{self.namespace}/devices/NAME")
            except DevClusterError as err:
                # The gateway reads them directly; only kubectl's path through the API server is missing.
                self.progress(f"readings are not an aggregated API on this plane: {err}")
        self._wait_healthy("gateway", f"http://127.0.0.1:{self.gateway_port}/healthz")
        self._wait_registered(admin, len(devices))
        return Ready(kubeconfig, self.namespace, broker_at.device_url, f"http://127.0.0.1:{self.gateway_port}/mcp",
                     token_file, len(devices), own_plane)

    def _front_proxy_ca(self) -> Path | None:
        """The local plane's front-proxy CA, when the demo runs on it (a real cluster's is its own business)."""
        if self.kubeconfig is not None:
            return None
        found = DevPlane(self.state_dir).running()
        return found.front_proxy_ca if found is not None and found.front_proxy_ca.is_file() else None

    def _cluster_and_broker(self, logs: Path) -> tuple[Path, BrokerAt, bool]:
        if self.kubeconfig is None:
            plane = DevPlane(self.state_dir, progress=self.progress)
            found = plane.running()
            if found is not None:
                self.progress(f"using the local plane already running in {self.state_dir}")
            else:
                self._plane = plane
                found = plane.up()
            if self.mqtt_url is not None:
                return found.kubeconfig, BrokerAt.of(self.mqtt_url, self.mqtt_password_file), self._plane is not None
            account = f"mqtt://{files.BROKER_CONTROLLER}@127.0.0.1:{found.mqtt_port}"
            return (found.kubeconfig, BrokerAt(account, found.mqtt_url, found.password_file(files.BROKER_CONTROLLER),
                                               found.broker_log), self._plane is not None)
        if self.mqtt_url is not None:
            return self.kubeconfig, BrokerAt.of(self.mqtt_url, self.mqtt_password_file), False
        port = free_port()
        passwords = broker.new_passwords()
        prepared = broker.prepare(self.state_dir / "demo-broker", port, free_port(), passwords)
        self.progress(f"starting a private Mosquitto on 127.0.0.1:{port} (no anonymous clients)")
        self.children.append(Child("mosquitto", subprocess.Popen(
            [find_mosquitto(), "-c", str(prepared.conf)], stdout=open(logs / "mosquitto.log", "ab"),  # noqa: SIM115 - the child owns it
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_environment(os.environ)),
            logs / "mosquitto.log"))
        _wait(lambda: accepts_connections(port), "Mosquitto to accept connections", 10)
        controller = f"mqtt://{files.BROKER_CONTROLLER}@127.0.0.1:{port}"
        return self.kubeconfig, BrokerAt(controller, f"mqtt://127.0.0.1:{port}", broker.password_file(
            self.state_dir / "demo-broker", files.BROKER_CONTROLLER), broker.debug_log(self.state_dir / "demo-broker")
        ), False

    def _enroll(self, admin: kubernetes.client.ApiClient, devices: list[DeviceSpec]) -> Path:
        """Enroll the simulated home as a person would (`corral devices enroll`): a Device and a credential
        each; the controller gives each its broker account. Enrollments kept from an earlier run are reused."""
        self.progress(f"enrolling the {len(devices)} simulated devices in namespace {self.namespace} "
                      "(a Device and a broker credential each, as `corral devices enroll` makes them)")
        passwords = {spec.device_id: enrollment.ensure_enrolled(admin, self.namespace, spec.device_id,
                                                                spec.device_type).password for spec in devices}
        path = self.state_dir / "demo-credentials.json"
        write_credentials(path, passwords)
        return path

    def _sign_firmware(self, admin: kubernetes.client.ApiClient) -> tuple[Path, str]:
        """What a vendor's build step does (`corral contracts keygen`, `corral contracts sign`): a signing key kept
        in the state directory (0600, reused by the next run), the catalog's contracts signed with it for the
        simulated firmware, and its public half in the Secret of trusted keys. The controller then requires
        signatures, as the chart does by default. Returns the signed build and the Secret (NAMESPACE/NAME)."""
        try:
            key = signing.ensure_key(self.state_dir / SIGNING_KEY_FILE)
            build = self.state_dir / "signed-contracts.json"
            signing.write_build(build, signing.sign_types([], key))
            signing.trust_key(admin, self.namespace, SIGNING_KEYS_SECRET, "demo", key, replace=True)  # its own entry
        except signing.SigningError as err:
            raise DevClusterError(f"signing the catalog's contracts: {err}") from None
        self.progress(f"signed the catalog's contracts ({build}) with {self.state_dir / SIGNING_KEY_FILE}, trusted "
                      f"in Secret {self.namespace}/{SIGNING_KEYS_SECRET}")
        return build, f"{self.namespace}/{SIGNING_KEYS_SECRET}"

    def _install(self, admin: kubernetes.client.ApiClient) -> None:
        try:
            install_api(admin, field_manager=FIELD_MANAGER)
        except TimeoutError as err:
            raise DevClusterError(str(err)) from None
        core = kubernetes.client.CoreV1Api(admin)
        try:
            core.create_namespace({"metadata": {"name": self.namespace}})
        except kubernetes.client.ApiException as err:
            if err.status != 409:
                raise
        apply_yaml(admin, yaml.safe_dump_all(user_roles() + self._bindings(local=self.kubeconfig is None)),
                   self.namespace, field_manager=FIELD_MANAGER, force=True)

    def _bindings(self, local: bool) -> list[dict[str, Any]]:
        def binding(kind: str, role: str, subject: dict[str, str], name: str) -> dict[str, Any]:
            meta: dict[str, str] = {"name": name}
            if kind == "RoleBinding":
                meta["namespace"] = self.namespace
            return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [subject]}

        rbac = "rbac.authorization.k8s.io"
        docs = [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent", "namespace": self.namespace}},
            binding("RoleBinding", "corral-agent-operator",
                    {"kind": "ServiceAccount", "name": "agent", "namespace": self.namespace}, "demo-agent"),
            binding("ClusterRoleBinding", "corral-capability-reader",
                    {"apiGroup": rbac, "kind": "Group", "name": "system:authenticated"}, "corral-demo-capability-reader"),
        ]
        if local:
            # The local plane's admin acts as an operator too (its stdio gateway creates Intents in its
            # name), and its second identity approves what needs a person.
            docs += [
                binding("RoleBinding", "corral-agent-operator",
                        {"apiGroup": rbac, "kind": "User", "name": files.ADMIN_USER}, "demo-admin-operator"),
                binding("RoleBinding", "corral-approver", {"apiGroup": rbac, "kind": "User", "name": files.DEV_USER},
                        "demo-approver"),
            ]
        return docs

    def _agent_token(self, admin: kubernetes.client.ApiClient) -> Path:
        # For the gateway's audience: over HTTP it accepts no other (`kubectl create token agent --audience ...`).
        request = {"spec": {"audiences": [GATEWAY_AUDIENCE], "expirationSeconds": 86400}}
        token = kubernetes.client.CoreV1Api(admin).create_namespaced_service_account_token(
            "agent", self.namespace, request).status.token
        self._check_audience(admin, token)
        path = self.state_dir / "agent-token"
        write_private(path, token)
        return path

    def _check_audience(self, admin: kubernetes.client.ApiClient, token: str) -> None:
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

    def _spawn(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        log = logs / f"{name}.log"
        with open(log, "ab") as out:
            # A session of its own: Ctrl-C reaches only the demo, which stops the children in order.
            proc = subprocess.Popen([sys.executable, "-m", "corral.cli.main", *args], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.children.append(Child(name, proc, log))

    def _wait_healthy(self, name: str, url: str) -> None:
        def healthy() -> bool:
            self.check_children()
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    return response.status == 200
            except OSError:
                return False

        _wait(healthy, f"the {name} to answer {url}", 60)

    def _wait_registered(self, admin: kubernetes.client.ApiClient, expected: int) -> None:
        objects = kubernetes.client.CustomObjectsApi(admin)
        last = [-1]

        def registered() -> bool:
            self.check_children()
            items = objects.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "devices")["items"]
            ready = sum(1 for i in items if (i.get("status") or {}).get("online") and (i.get("status") or {}).get("capability"))
            if ready != last[0]:
                self.progress(f"enrolled devices online: {ready}/{expected}")
                last[0] = ready
            return ready >= expected

        _wait(registered, "every simulated device to come online", 120, interval_s=1.0)

    # ---- run and stop ----------------------------------------------------------------------------------------

    def check_children(self) -> None:
        for child in self.children:
            if child.proc.poll() is not None:
                tail = "\n".join(child.log.read_text(errors="replace").splitlines()[-15:])
                raise DevClusterError(f"the {child.name} exited with {child.proc.returncode} (log {child.log}):\n{tail}")

    def stop(self) -> None:
        # A second Ctrl-C (or SIGTERM) must not cut the clean-up short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for child in reversed(self.children):
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            try:
                child.proc.wait(20)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait(5)
            self.progress(f"stopped the {child.name}")
        self.children.clear()
        if self._readings_api is not None:
            # An APIService nobody serves makes API discovery fail for every kubectl on a plane that stays up.
            try:
                unregister_readings_api(self._readings_api)
            except (kubernetes.client.ApiException, OSError) as err:
                self.progress(f"could not remove the readings APIService: {err}")
            self._readings_api = None
        if self._plane is not None:
            for line in self._plane.down():
                self.progress(line)
            self._plane = None


def _wait(probe: Callable[[], bool], what: str, timeout_s: float, interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise DevClusterError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)
