"""Starting, finding and stopping the local plane: kube-apiserver (+etcd) and Mosquitto.

Everything lives in one state directory (`.corral/dev` for `corral dev up`, a
temporary one for a test session): certificates, etcd data, tokens, logs, the
kubeconfig, the env file and `plane.json`, which records the processes we
started. `up` is idempotent: what runs and is ours is reused, what is missing
is started. `down` stops only processes recorded as ours.

Each component is recorded with a hash of the configuration it was started
with (its command line, the binary, the files it reads). A running component
whose configuration differs from what this checkout would start (an older
checkout started it, or its settings changed) is restarted by `up`, and is
not reused by `running()`: a test must never pass against a stale plane.

A plane is started with or without a node (`corral dev up --node`, node.py), and records which: a node's API
server listens for Pods on the node's address and authorizes kubelets (Node authorizer, NodeRestriction), so
that is part of its configuration. A plane without a node is exactly what it always was.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from corral.api.codes import GATEWAY_AUDIENCE
from corral.devcluster import broker, files, nodeconfig, nodehost, nodepki
from corral.devcluster.errors import DevClusterError
from corral.devcluster.kubebinary import KubeBinary, ensure_binary, expected_binary
from corral.devcluster.processes import (
    ProcessRecord,
    accepts_connections,
    config_hash,
    free_port,
    is_ours,
    port_is_free,
    start_detached,
    stop,
)
from corral.privatefile import write_private

Progress = Callable[[str], None]

APISERVER = "kube-apiserver"
BROKER = "mosquitto"
READY_TIMEOUT_S = 180.0
DEFAULT_STATE_DIR = Path(".corral") / "dev"
_PORT = 0  # stands for the port in configuration hashes: a component moved to a free port is not stale
# Go's garbage collector took a sixth of kube-apiserver's CPU under bench/throughput.py (docs/performance.md,
# "The API server's CPU"): its mark work per allocated byte halves when the heap may grow twice as far past
# the live data before a cycle. A development plane has the memory to spare; a production server (k3s) keeps
# its own setting.
APISERVER_ENV = {"GOGC": "200"}


@dataclass(frozen=True)
class Plane:
    """How to reach a running plane."""

    state_dir: Path
    server: str
    mqtt_url: str  # plain MQTT, loopback, no credentials in it: every client brings its own account
    kubeconfig: Path
    env_file: Path
    ca_file: Path
    admin_token: str
    user_token: str
    kubectl: Path
    version: str
    mqtt_tls_url: str = ""  # the same broker over TLS; its CA is mqtt_ca_file
    mqtt_ca_file: Path = Path()
    broker_passwords: dict[str, str] = field(default_factory=dict)  # controller, admin
    audit_log: Path = Path()  # kube-apiserver's own audit log (JSON lines): every write to group corral.dev
    # The aggregation layer's requestheader CA (--requestheader-client-ca-file): it signed the front-proxy client
    # certificate (CN front-proxy-client) kube-apiserver presents to an APIService's server, which trusts
    # X-Remote-User/-Group only over that certificate (`corral run --requestheader-client-ca-file`).
    front_proxy_ca: Path = Path()

    @property
    def mqtt_port(self) -> int:
        return int(self.mqtt_url.rsplit(":", 1)[1])

    @property
    def mqtt_tls_port(self) -> int:
        return int(self.mqtt_tls_url.rsplit(":", 1)[1])

    @property
    def broker_log(self) -> Path:
        """The broker's debug log, with its refused PUBLISHes: `corral run --broker-log`."""
        return broker.debug_log(self.state_dir / "broker")

    def password_file(self, who: str) -> Path:
        """The file (mode 0600) holding the broker password of `who` (one of files.LOCAL_CONTROLLER_ACCOUNTS, each
        a controller replica's, or BROKER_ADMIN)."""
        return broker.password_file(self.state_dir / "broker", who)

    def mqtt_args_as(self, who: str, tls: bool = False) -> list[str]:
        """`corral run` options that connect as `who`: the URL with the username only, the password by file."""
        base = self.mqtt_tls_url if tls else self.mqtt_url
        scheme, rest = base.split("://", 1)
        return ["--mqtt", f"{scheme}://{quote(who)}@{rest}", "--mqtt-password-file", str(self.password_file(who))]


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    running: bool
    pid: int | None
    endpoint: str | None
    detail: str


class DevPlane:
    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR, progress: Progress = print) -> None:
        self.state_dir = state_dir.resolve()
        self.progress = progress

    # Paths -------------------------------------------------------------------------------

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def env_path(self) -> Path:
        return self.state_dir / "env"

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "plane.json"

    @property
    def _kube_dir(self) -> Path:
        return self.state_dir / "kube"

    @property
    def _ca_file(self) -> Path:
        return self._kube_dir / "pki" / "ca.crt"

    @property
    def _front_proxy_ca_file(self) -> Path:
        return self._kube_dir / "pki" / "front-proxy-ca.crt"

    @property
    def audit_policy_path(self) -> Path:
        return self.state_dir / "kube-audit-policy.yaml"

    @property
    def audit_log_path(self) -> Path:
        return self.state_dir / "kube-audit.log"

    def _log(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    # Commands ----------------------------------------------------------------------------

    @property
    def node_layout(self) -> nodeconfig.NodeLayout:
        return nodeconfig.NodeLayout(self.state_dir / "node")

    def up(self, node: bool | None = None) -> Plane:
        """Start or reuse the plane. `node` True or False records whether it serves a node; None keeps what was
        recorded (a new plane has none)."""
        binary = ensure_binary(self.progress)
        mosquitto = find_mosquitto()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # Tokens, keys, passwords, etcd's data and the kubeconfig live in here: no one else may even look in.
        self.state_dir.chmod(0o700)
        state = self._load_state()
        if node is not None:
            state["node"] = node
        if state.get("node"):
            self._prepare_node_files()
        tokens = state.setdefault("tokens", {})
        tokens.setdefault("admin", secrets.token_urlsafe(32))
        tokens.setdefault("user", secrets.token_urlsafe(32))
        write_private(self.state_dir / "tokens.csv", files.token_auth_csv(tokens["admin"], tokens["user"]))
        write_private(self.audit_policy_path, files.kube_audit_policy())

        node_flags = self._node_flags(state)
        api_port = self._ensure_running(state, APISERVER,
                                        lambda port: self._apiserver_argv(binary.path, port, node_flags),
                                        self._apiserver_config(binary.path, node_flags), APISERVER_ENV)
        passwords = state.setdefault("broker", broker.new_passwords())
        tls_port = self._tls_port(state)

        def broker_argv(port: int) -> list[str]:
            prepared = broker.prepare(self._broker_dir, port, tls_port, passwords)
            return [mosquitto, "-c", str(prepared.conf)]

        mqtt_port = self._ensure_running(state, BROKER, broker_argv, self._broker_config(mosquitto, tls_port))
        self._write_password_files(state)
        state["version"] = binary.version
        self._save_state(state)

        self._wait_for_broker(state, mqtt_port)
        plane = self._describe(state, binary, api_port, mqtt_port)
        self._wait_for_apiserver(state, plane)
        write_private(self.kubeconfig_path, files.kubeconfig(
            plane.server, self._ca_file.read_bytes(), plane.admin_token, plane.user_token
        ))
        write_private(self.env_path, files.env_file(
            self.kubeconfig_path, f"mqtt://{files.BROKER_CONTROLLER}@127.0.0.1:{mqtt_port}",
            plane.password_file(files.BROKER_CONTROLLER), binary.kubectl.parent, plane.mqtt_ca_file,
            plane.broker_log))
        return plane

    @property
    def _broker_dir(self) -> Path:
        return self.state_dir / "broker"

    def _tls_port(self, state: dict) -> int:
        """The broker's TLS listener: the port it had, or a free one."""
        entry = state.setdefault(BROKER, {})
        record = self._record(state, BROKER)
        port = entry.get("tls_port")
        if not isinstance(port, int) or (not port_is_free(port) and not (record is not None and is_ours(record))):
            port = free_port()
        entry["tls_port"] = port
        return port

    # What each component is started with; a change of any of it restarts the component.

    def _apiserver_argv(self, binary: Path, port: int, node_flags: list[str]) -> list[str]:
        return [
            str(binary),
            "serve",
            f"--state-dir={self._kube_dir}",
            f"--port={port}",
            "--",
            nodeconfig.authorization_mode(bool(node_flags)),
            f"--token-auth-file={self.state_dir / 'tokens.csv'}",
            "--profiling=false",
            # Tokens for the MCP gateway carry its audience; the API server accepts them too. Added to the one
            # corral-kube passes (the kubernetes.default.svc issuer), which stays the first and the default.
            f"--api-audiences={GATEWAY_AUDIENCE}",
            # Kubernetes' own audit (files.kube_audit_policy): who wrote which corral.dev object, with bodies.
            f"--audit-policy-file={self.audit_policy_path}",
            f"--audit-log-path={self.audit_log_path}",
            "--audit-log-format=json",
            "--audit-log-maxsize=100",
            "--audit-log-maxbackup=3",
            *node_flags,
        ]

    def _apiserver_config(self, binary: Path, node_flags: list[str]) -> str:
        # The policy's text, not the file on disk: a changed policy in this checkout makes a running plane stale.
        return config_hash([*self._apiserver_argv(binary, _PORT, node_flags), files.kube_audit_policy(),
                            *(f"{name}={value}" for name, value in sorted(APISERVER_ENV.items()))], [])

    def _node_flags(self, state: dict) -> list[str]:
        if not state.get("node"):
            return []
        pki = self.node_layout.pki
        return nodeconfig.apiserver_node_flags(nodehost.node_ip(), nodeconfig.ApiserverNodeFiles(
            pki / "apiserver-kubelet-client.crt", pki / "apiserver-kubelet-client.key", pki / "kubelet-ca.crt"))

    def _prepare_node_files(self) -> None:
        """The kubelet CA and the API server's client certificate for kubelets, made before the API server
        starts with them (nodepki says why they cannot come from the plane's CA)."""
        pki = self.node_layout.pki
        ca = nodepki.ensure_ca(pki / "kubelet-ca.crt", pki / "kubelet-ca.key", "corral-kubelet-ca")
        cert, key = pki / "apiserver-kubelet-client.crt", pki / "apiserver-kubelet-client.key"
        if not (cert.exists() and key.exists()):
            nodepki.write_pair(nodepki.issue_client(ca, nodepki.Identity(nodepki.APISERVER_KUBELET_CLIENT)),
                               cert, key)

    def _broker_config(self, mosquitto: str, tls_port: int) -> str:
        tls = broker.certificates(self._broker_dir)
        conf = files.mosquitto_conf(_PORT, broker.plugin_path(), self._broker_dir / "dynamic-security.json",
                                    files.BrokerTls(tls_port, tls.ca_file, tls.cert_file, tls.key_file),
                                    broker.debug_log(self._broker_dir))
        # The controller's role and accounts too: a broker started with a wider role, or without the replicas'
        # accounts (an older checkout's), is restarted with these; until then running() does not offer it to tests.
        return config_hash([mosquitto, conf, json.dumps(files.controller_acls()),
                            json.dumps(files.LOCAL_CONTROLLER_ACCOUNTS)], [tls.ca_file, tls.cert_file])

    def _write_password_files(self, state: dict) -> None:
        """The broker accounts' passwords as files (mode 0600) for `--mqtt-password-file`, again on every use:
        a plane started by an older checkout had none."""
        accounts = [(who, "controller") for who in files.LOCAL_CONTROLLER_ACCOUNTS] + [(files.BROKER_ADMIN, "admin")]
        for who, key in accounts:
            path = broker.password_file(self._broker_dir, who)
            password = (state.get("broker") or {}).get(key)
            if password and (not path.exists() or path.read_text().strip() != password):
                write_private(path, password + "\n")

    def stale(self) -> list[str]:
        """Components running with another configuration than this checkout would start them with."""
        state = self._load_state()
        wanted = {APISERVER: self._apiserver_config(expected_binary(), self._node_flags(state))}
        try:
            tls_port = state.get(BROKER, {}).get("tls_port")
            if isinstance(tls_port, int):
                wanted[BROKER] = self._broker_config(find_mosquitto(), tls_port)
        except DevClusterError:
            pass
        return [name for name, config in wanted.items() if state.get(name, {}).get("config") != config]

    def running(self) -> Plane | None:
        """The plane in this state directory if both processes are ours and the API answers."""
        state = self._load_state()
        records = {name: self._record(state, name) for name in (APISERVER, BROKER)}
        if not all(r is not None and is_ours(r) for r in records.values()):
            return None
        if not self.kubeconfig_path.exists():
            return None
        stale = self.stale()
        if stale:
            self.progress(f"the plane in {self.state_dir} runs {', '.join(stale)} with another configuration than this "
                          "checkout's (`corral dev up` restarts it); not using it")
            return None
        binary_path = Path(records[APISERVER].argv[0])  # type: ignore[union-attr]  # checked not None just above
        kubectl = binary_path.parent / "kubectl"
        binary = KubeBinary(path=binary_path, kubectl=kubectl, version=state.get("version", "unknown"))
        plane = self._describe(state, binary, state[APISERVER]["port"], state[BROKER]["port"])
        if _get(plane.server, plane.ca_file, plane.admin_token, "/readyz") != "ok":
            return None
        self._write_password_files(state)
        return plane

    def status(self) -> list[ComponentStatus]:
        state = self._load_state()
        result = []
        for name in (APISERVER, BROKER):
            record = self._record(state, name)
            port = state.get(name, {}).get("port")
            alive = record is not None and is_ours(record)
            if name == APISERVER:
                endpoint = f"https://127.0.0.1:{port}" if port else None
            else:
                endpoint = f"mqtt://127.0.0.1:{port}" if port else None
            if not alive:
                detail = "not running" if record is None else f"not running (last pid {record.pid})"
            elif name == APISERVER:
                detail = self._apiserver_detail(state, port)
            else:
                detail = "accepting connections" if accepts_connections(port) else "not accepting connections yet"
            result.append(ComponentStatus(name, alive, record.pid if alive and record else None, endpoint, detail))
        return result

    def down(self, purge: bool = False, only: str | None = None) -> list[str]:
        """Stop the processes this state directory started; with purge, delete the directory too.

        `only` (APISERVER or BROKER) stops just that one, as a fault would; `up()` starts it again on
        the same port, with the same data.
        """
        state = self._load_state()
        said = []
        for name in (BROKER, APISERVER) if only is None else (only,):
            record = self._record(state, name)
            if record is None:
                said.append(f"{name}: was not started here")
            elif stop(record):
                said.append(f"{name}: stopped (pid {record.pid})")
            else:
                said.append(f"{name}: was not running (pid {record.pid} is gone or belongs to another program)")
            state.get(name, {}).pop("process", None)
        if purge:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            said.append(f"removed {self.state_dir}")
        elif state:
            self._save_state(state)
        return said

    # Internals ---------------------------------------------------------------------------

    def _ensure_running(self, state: dict, name: str, argv_for: Callable[[int], list[str]], config: str,
                        env: Mapping[str, str] | None = None) -> int:
        entry = state.setdefault(name, {})
        record = self._record(state, name)
        if record is not None and is_ours(record):
            if entry.get("config") == config:
                self.progress(f"{name}: already running (pid {record.pid}), reusing it")
                return int(entry["port"])
            self.progress(f"{name}: running (pid {record.pid}) with another configuration than this checkout's "
                          "(started by an older checkout, or its settings changed); restarting it")
            stop(record)
        port = entry.get("port")
        if not isinstance(port, int) or not port_is_free(port):
            port = free_port()
        argv = argv_for(port)
        record = start_detached(argv, self._log(name), env=env)
        entry["port"] = port
        entry["process"] = record.to_json()
        entry["config"] = config
        self._save_state(state)  # recorded at once: whatever happens next, `down` can still find it
        self.progress(f"{name}: started (pid {record.pid}, port {port}, log {self._log(name)})")
        return port

    def _describe(self, state: dict, binary: KubeBinary, api_port: int, mqtt_port: int) -> Plane:
        return Plane(
            state_dir=self.state_dir,
            server=f"https://127.0.0.1:{api_port}",
            mqtt_url=f"mqtt://127.0.0.1:{mqtt_port}",
            kubeconfig=self.kubeconfig_path,
            env_file=self.env_path,
            ca_file=self._ca_file,
            admin_token=state["tokens"]["admin"],
            user_token=state["tokens"]["user"],
            kubectl=binary.kubectl,
            version=binary.version,
            mqtt_tls_url=f"mqtts://127.0.0.1:{state.get(BROKER, {}).get('tls_port')}",
            mqtt_ca_file=self._broker_dir / "tls" / "ca.crt",
            broker_passwords=dict(state.get("broker") or {}),
            audit_log=self.audit_log_path,
            front_proxy_ca=self._front_proxy_ca_file,
        )

    def _wait_for_apiserver(self, state: dict, plane: Plane) -> None:
        record = self._record(state, APISERVER)
        started = time.monotonic()
        last_said = started
        while True:
            if record is not None and not is_ours(record):
                raise DevClusterError(f"kube-apiserver exited during start-up:\n{self._tail(APISERVER)}")
            if _get(plane.server, plane.ca_file, plane.admin_token, "/readyz") == "ok":
                self.progress(f"kube-apiserver: ready after {time.monotonic() - started:.1f}s")
                return
            now = time.monotonic()
            if now - started > READY_TIMEOUT_S:
                raise DevClusterError(
                    f"kube-apiserver was not ready after {READY_TIMEOUT_S:.0f}s; "
                    f"its log ({self._log(APISERVER)}) ends with:\n{self._tail(APISERVER)}"
                )
            if now - last_said >= 10:
                self.progress(f"kube-apiserver: waiting for /readyz ({now - started:.0f}s)")
                last_said = now
            time.sleep(0.25)

    def _wait_for_broker(self, state: dict, port: int) -> None:
        record = self._record(state, BROKER)
        deadline = time.monotonic() + 20
        while not accepts_connections(port):
            if record is not None and not is_ours(record):
                raise DevClusterError(f"mosquitto exited during start-up:\n{self._tail(BROKER)}")
            if time.monotonic() > deadline:
                raise DevClusterError(f"mosquitto did not accept connections on port {port} within 20s")
            time.sleep(0.1)

    def _apiserver_detail(self, state: dict, port: int) -> str:
        server, token = f"https://127.0.0.1:{port}", state.get("tokens", {}).get("admin", "")
        ready = _get(server, self._ca_file, token, "/readyz")
        if ready is None:
            return "running, not answering yet"
        try:
            version = json.loads(_get(server, self._ca_file, token, "/version") or "{}").get("gitVersion", "?")
        except ValueError:
            version = "?"
        return f"{version}, /readyz {ready}"

    def _record(self, state: dict, name: str) -> ProcessRecord | None:
        return ProcessRecord.of_entry(state.get(name, {}))

    def _tail(self, component: str, lines: int = 25) -> str:
        try:
            return "\n".join(self._log(component).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _load_state(self) -> dict:
        try:
            data = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as err:
            raise DevClusterError(f"{self._state_file} is not valid JSON ({err}); remove it and run again") from None
        return data if isinstance(data, dict) else {}

    def _save_state(self, state: dict) -> None:
        write_private(self._state_file, json.dumps(state, indent=2) + "\n")


def find_mosquitto() -> str:
    candidate = os.environ.get("CORRAL_MOSQUITTO") or shutil.which("mosquitto")
    if candidate is None and os.access("/usr/sbin/mosquitto", os.X_OK):
        candidate = "/usr/sbin/mosquitto"
    if candidate is None:
        raise DevClusterError(
            "Mosquitto (the MQTT broker) was not found; install it with `apt-get install mosquitto` "
            "or point CORRAL_MOSQUITTO at its binary"
        )
    return candidate


def _get(server: str, ca_file: Path, token: str, path: str) -> str | None:
    """GET a path on the API server; None when it does not answer 200."""
    request = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        context = ssl.create_default_context(cafile=str(ca_file))
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return None

