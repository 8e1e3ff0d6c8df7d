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
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import kubernetes
import yaml

from corral.api.roles import user_roles
from corral.client.apply import apply_yaml
from corral.client.install import install_api
from corral.devcluster import broker, demosteps, files
from corral.devcluster.demosteps import SIGNING_KEY_FILE, SIGNING_KEYS_SECRET, Child, wait_until
from corral.devcluster.errors import DevClusterError
from corral.devcluster.naming import name_devices
from corral.devcluster.plane import DevPlane, find_mosquitto
from corral.devcluster.processes import accepts_connections, child_environment, free_port, port_is_free
from corral.devcluster.readings_api import register_readings_api, unregister_readings_api
from corral_sim.presets import overlay_of, preset

FIELD_MANAGER = "corral-demo"
AUDIT_PORT = 8443  # the audit log reader, as the README shows it (another port when 8443 is taken)
Progress = Callable[[str], None]
__all__ = ["SIGNING_KEYS_SECRET", "SIGNING_KEY_FILE", "BrokerAt", "Child", "Demo", "Ready"]


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
        token_file = demosteps.agent_token(admin, self.namespace, "agent", self.state_dir / "agent-token")
        devices = preset("home")
        credentials = demosteps.enroll(admin, self.namespace, devices, self.state_dir / "demo-credentials.json",
                                       self.progress)
        name_devices(admin, self.namespace, overlay_of("home"), FIELD_MANAGER)  # "Front door" in the "Hallway"
        signed_build, signing_keys = demosteps.sign_firmware(admin, self.state_dir, self.namespace, self.progress)
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
                                   "--bridge-namespace", self.namespace,
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
        demosteps.wait_online(admin, self.namespace, len(devices), self.progress, self.check_children)
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
        wait_until(lambda: accepts_connections(port), "Mosquitto to accept connections", 10)
        controller = f"mqtt://{files.BROKER_CONTROLLER}@127.0.0.1:{port}"
        return self.kubeconfig, BrokerAt(controller, f"mqtt://127.0.0.1:{port}", broker.password_file(
            self.state_dir / "demo-broker", files.BROKER_CONTROLLER), broker.debug_log(self.state_dir / "demo-broker")
        ), False

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

    def _spawn(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.children.append(demosteps.spawn_corral(name, args, env, logs))

    def _wait_healthy(self, name: str, url: str) -> None:
        def healthy() -> bool:
            self.check_children()
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_until(healthy, f"the {name} to answer {url}", 60)

    # ---- run and stop ----------------------------------------------------------------------------------------

    def check_children(self) -> None:
        demosteps.check_children(self.children)

    def stop(self) -> None:
        demosteps.stop_uninterrupted(self.children, self.progress)
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

