"""`corral dev up --node`: a real node beside the local plane, as a k3s server runs one, and its removal.

What runs, all on this machine: containerd (Debian's 1.6.20, out of upstream support since 2025 but still
served by the v1.36 kubelet, which falls back to the configured cgroup driver when the runtime cannot report
one), the kubelet, kube-scheduler, kube-controller-manager and kube-proxy from the cached corral-kube binary,
kube-router's NetworkPolicy controller as a host process (k3s runs it in-process), and CoreDNS and
local-path-provisioner as Deployments. What differs from k3s: the parts are separate processes of upstream
builds rather than one k3s executable; the Pod network is a plain CNI bridge on 10.42.0.0/24 instead of
flannel (one node needs no overlay); Traefik, ServiceLB and metrics-server are not deployed.

Everything the node writes lives in `<state dir>/node`; the machine-wide parts (iptables, cni0, cgroups,
sysctls, the kubelet's fixed paths) are recorded before start and removed by `down` (nodeclean.py). One node
per machine: a second is refused naming the first.
"""

from __future__ import annotations

import base64
import functools
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from corral.devcluster import addonbinaries, images, nodeaddons, nodeclean, nodeconfig, nodehost, nodepki
from corral.devcluster.errors import DevClusterError
from corral.devcluster.kubebinary import ensure_binary
from corral.devcluster.plane import ComponentStatus, DevPlane, Plane
from corral.devcluster.processes import ProcessRecord, config_hash, is_ours, start_detached, stop
from corral.privatefile import write_private

Progress = Callable[[str], None]

CONTAINERD = "containerd"
KUBELET = "kubelet"
SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
KUBE_PROXY = "kube-proxy"
KUBE_ROUTER = "kube-router"
# Stopped in reverse of this order, which is also the start order: the kubelet after containerd and after the
# API server has its node flags (plane.py); kube-router last, once the node it polices is registered.
COMPONENTS = (CONTAINERD, CONTROLLER_MANAGER, SCHEDULER, KUBE_PROXY, KUBELET, KUBE_ROUTER)
NODE_IMAGES = ("pause", "busybox", "coredns", "local-path-provisioner")
READY_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class NodePlane:
    """A plane with a running node: what a test or a person needs to use it."""

    plane: Plane
    node_name: str
    node_ip: str
    containerd_socket: Path
    ctr: Path
    images: dict[str, str]  # image name (images.py) -> reference present on the node
    storage_dir: Path  # where local-path PersistentVolumes live on this machine
    policy_enforcer: str  # what enforces NetworkPolicy here, e.g. "kube-router v2.1.0 (its policy controller)"

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def kubectl(self) -> Path:
        return self.plane.kubectl

    def kubectl_argv(self, *args: str) -> list[str]:
        return [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", *args]

    def ctr_argv(self, *args: str) -> list[str]:
        """`ctr` on the node's containerd in the kubelet's namespace (k8s.io), e.g. ("images", "import", FILE)."""
        return [str(self.ctr), "-a", str(self.containerd_socket), "-n", "k8s.io", *args]


class DevNode:
    def __init__(self, state_dir: Path = Path(".corral") / "dev", progress: Progress = print) -> None:
        self.plane = DevPlane(state_dir, progress)
        self.state_dir = self.plane.state_dir
        self.layout = self.plane.node_layout
        self.progress = progress
        self._started: set[str] = set()  # components this `up` started or reused: the ones a wait watches
        self._reused: set[str] = set()
        self.claimed = False  # whether this `up` made its node the machine's one (a refused `up` changed nothing)

    # Up ----------------------------------------------------------------------------------

    def up(self) -> NodePlane:
        started = time.monotonic()
        nodehost.require_root()
        self._refuse_second_node()
        containerd, ctr = _system_binary("containerd"), _system_binary("ctr")
        binary = ensure_binary(self.progress)
        built = images.ensure_images(self.progress, names=NODE_IMAGES)
        kube_router = addonbinaries.ensure_kube_router(self.progress)
        name, address = nodehost.node_name(), nodehost.node_ip()
        self._check_resolv_conf()

        state = self._load()
        if "machine" not in state:  # the first start since a clean machine: what to give back at `down`
            state["machine"] = {"sysctls": nodeclean.read_sysctls(),
                                "made": [str(p) for p in nodeclean.MACHINE_PATHS if not p.exists()]}
            self._save(state)
        plane = self.plane.up(node=True)
        self._write_files(plane, name, address)

        self._ensure(state, CONTAINERD, nodeconfig.containerd_argv(containerd, self.layout),
                     [self.layout.containerd_config])
        self._wait_for_containerd(state, ctr)
        images.import_images(str(ctr), self.layout.containerd_socket, built.values(), self.progress)
        self._apply(plane, nodeaddons.node_rbac())

        pki = self.plane.state_dir / "kube" / "pki"
        kubeconfigs = self.layout.kubeconfigs
        self._ensure(state, CONTROLLER_MANAGER, nodeconfig.controller_manager_argv(
            binary.path, self.layout, pki / "ca.crt", pki / "ca.key", pki / "sa.key"),
            [kubeconfigs / "controller-manager.kubeconfig"])
        self._ensure(state, SCHEDULER, nodeconfig.scheduler_argv(binary.path, self.layout),
                     [kubeconfigs / "scheduler.kubeconfig"])
        self._ensure(state, KUBE_PROXY, nodeconfig.kube_proxy_argv(binary.path, self.layout),
                     [self.layout.kube_proxy_config, kubeconfigs / "kube-proxy.kubeconfig"])
        kubelet_started = time.monotonic()
        self._ensure(state, KUBELET, nodeconfig.kubelet_argv(binary.path, self.layout, name, address),
                     [self.layout.kubelet_config, kubeconfigs / "kubelet.kubeconfig"])
        node = NodePlane(plane=plane, node_name=name, node_ip=address, containerd_socket=self.layout.containerd_socket,
                         ctr=ctr, images={key: image.ref for key, image in built.items()},
                         storage_dir=self.layout.local_path_storage,
                         policy_enforcer=f"kube-router {addonbinaries.KUBE_ROUTER.version} (its policy controller)")
        kubelet_since = float(state["components"][KUBELET].get("started_at", 0))
        self._wait(state, f"node {name} Ready", lambda: self._node_ready(node, kubelet_since))
        kubelet_said = "the kubelet was running already" if KUBELET in self._reused else \
            f"{time.monotonic() - kubelet_started:.1f}s after the kubelet started"
        self.progress(f"node {name} ({address}) Ready {kubelet_said}, {time.monotonic() - started:.1f}s after `up`")
        # kube-router finds its node by name when it starts, so it comes once the kubelet has registered it.
        self._ensure(state, KUBE_ROUTER, nodeconfig.kube_router_argv(
            kube_router, name, self.layout.kubeconfig("kube-router")), [kubeconfigs / "kube-router.kubeconfig"])
        self._apply(plane, nodeaddons.coredns(built["coredns"].ref))
        self._apply(plane, nodeaddons.local_path(built["local-path-provisioner"].ref, built["busybox"].ref,
                                                 str(self.layout.local_path_storage)))
        for deployment in (nodeaddons.COREDNS, nodeaddons.LOCAL_PATH):
            self._wait(state, f"{deployment} available", functools.partial(self._deployment_available, node,
                                                                           deployment),
                       explain=functools.partial(_deployment_logs, node, deployment))
        self.progress(f"add-ons Ready (CoreDNS at {nodeconfig.CLUSTER_DNS}, StorageClass {nodeaddons.STORAGE_CLASS}, "
                      f"NetworkPolicy by kube-router) {time.monotonic() - started:.1f}s after `up`")
        return node

    def _refuse_second_node(self) -> None:
        def running(state_dir: Path) -> list[str]:
            return [f"{name} running" for name, record in DevNode(state_dir, self.progress)._records().items()
                    if is_ours(record)]
        ended = nodehost.claim_machine(self.state_dir, running)
        self.claimed = True
        if ended is not None:
            self.progress(f"the node of {ended} is no longer running; removing what it left on this machine")
            DevNode(ended, self.progress)._clean_machine()

    def _check_resolv_conf(self) -> None:
        loops = nodeconfig.loopback_nameservers(Path("/etc/resolv.conf").read_text())
        if loops:
            raise DevClusterError(
                f"/etc/resolv.conf names the nameserver {', '.join(loops)}, which only this machine can reach: CoreDNS "
                "would forward to itself. Point /etc/resolv.conf at the upstream resolver (e.g. systemd-resolved's "
                "/run/systemd/resolve/resolv.conf) before starting the node")

    def _write_files(self, plane: Plane, name: str, address: str) -> None:
        layout = self.layout
        for directory in (layout.cni_conf_dir, layout.cni_ipam_dir, layout.kubelet_root, layout.pod_logs,
                          layout.static_pods, layout.volume_plugins, layout.local_path_storage, layout.kubeconfigs):
            directory.mkdir(parents=True, exist_ok=True)
        kube_pki = self.state_dir / "kube" / "pki"
        cluster_ca = nodepki.load_ca(kube_pki / "ca.crt", kube_pki / "ca.key")
        kubelet_ca = nodepki.load_ca(layout.pki / "kubelet-ca.crt", layout.pki / "kubelet-ca.key")
        identities = {**nodepki.COMPONENT_IDENTITIES, "kubelet": nodepki.kubelet_identity(name)}
        for component, identity in identities.items():
            path = layout.kubeconfig(component)
            if path.exists() and _same_ca_and_user(path, cluster_ca.cert_pem, identity.common_name, plane.server):
                continue
            pair = nodepki.issue_client(cluster_ca, identity)
            write_private(path, nodeconfig.component_kubeconfig(plane.server, cluster_ca.cert_pem, identity.common_name,
                                                                pair.cert_pem, pair.key_pem))
        serving_cert, serving_key = layout.pki / "kubelet-serving.crt", layout.pki / "kubelet-serving.key"
        marker = layout.pki / "kubelet-serving.names"
        names = f"{address} {name}"
        if not serving_cert.exists() or not marker.exists() or marker.read_text() != names:
            nodepki.write_pair(nodepki.issue_server(kubelet_ca, name, (address, name)), serving_cert, serving_key)
            marker.write_text(names)
        client_ca = layout.pki / "kubelet-client-ca.crt"  # who may call the kubelet: the API server, admins
        client_ca.write_bytes(kubelet_ca.cert_pem + cluster_ca.cert_pem)
        layout.containerd_config.parent.mkdir(parents=True, exist_ok=True)
        layout.containerd_config.write_text(nodeconfig.containerd_config(layout))
        (layout.cni_conf_dir / "10-corral.conflist").write_text(nodeconfig.cni_conflist(layout))
        layout.kubelet_config.write_text(nodeconfig.kubelet_config(layout, client_ca, serving_cert, serving_key))
        layout.kube_proxy_config.write_text(nodeconfig.kube_proxy_config(layout, name, layout.kubeconfig("kube-proxy")))

    def status(self) -> list[ComponentStatus]:
        """The node's components, when this plane has a node (none otherwise)."""
        records = self._records()
        found = []
        for name in COMPONENTS:
            record = records.get(name)
            if record is None:
                continue
            alive = is_ours(record)
            endpoint = f"unix://{self.layout.containerd_socket}" if name == CONTAINERD else None
            found.append(ComponentStatus(name, alive, record.pid if alive else None, endpoint,
                                         "running" if alive else f"not running (last pid {record.pid})"))
        return found

    # Down --------------------------------------------------------------------------------

    def down(self, purge: bool = False) -> list[str]:
        """Stop the node (if this plane has one) and remove what it set up, then stop the plane."""
        said: list[str] = []
        state = self._load()
        records = self._records()
        if records or "machine" in state:
            started = time.monotonic()
            nodehost.require_root()
            for name in reversed(COMPONENTS):
                record = records.get(name)
                if record is None:
                    continue
                if name == CONTAINERD:
                    nodeclean.kill_pods(self.progress)  # before containerd goes: its shims hold the containers
                said.append(f"{name}: stopped (pid {record.pid})" if stop(record, grace_s=10)
                            else f"{name}: was not running")
                state.get("components", {}).pop(name, None)
                self._save(state)
            self._clean_machine()
            said.append(f"node: removed what it set up on this machine in {time.monotonic() - started:.1f}s")
        said.extend(self.plane.down(purge=purge))
        if not purge and state:
            state.pop("components", None)
            state.pop("machine", None)
            self._save(state)
        return said

    def _clean_machine(self) -> None:
        state = self._load()
        machine = state.get("machine", {})
        progress = self.progress
        nodeclean.kill_pods(progress)
        nodeclean.kill_shims(self.layout.containerd_socket, progress)
        binary = ensure_binary(progress)
        subprocess.run([str(binary.path), "proxy", "--cleanup"], capture_output=True, check=False, timeout=120)
        nodeclean.unmount_under([self.layout.kubelet_root, self.layout.containerd_root, self.layout.containerd_state,
                                 Path("/var/lib/kubelet"), Path("/run/containerd")], progress)
        nodeclean.remove_network(progress)
        # The containers went without CNI DEL: their address leases would pile up over restarts of a kept plane.
        shutil.rmtree(self.layout.cni_ipam_dir, ignore_errors=True)
        nodeclean.remove_kubepods_cgroups(progress)
        nodeclean.remove_machine_files(self.layout, list(machine.get("made", [])), progress)
        nodeclean.restore_sysctls(dict(machine.get("sysctls", {})), progress)
        nodehost.release_claim(self.state_dir)
        if "machine" in state:
            state.pop("machine")
            self._save(state)

    # Internals ---------------------------------------------------------------------------

    def _ensure(self, state: dict, name: str, argv: list[str], files_read: list[Path]) -> None:
        components = state.setdefault("components", {})
        entry = components.setdefault(name, {})
        config = config_hash(argv, files_read)
        record = ProcessRecord.of_entry(entry)
        self._started.add(name)
        if record is not None and is_ours(record):
            if entry.get("config") == config:
                self.progress(f"{name}: already running (pid {record.pid}), reusing it")
                self._reused.add(name)
                return
            self.progress(f"{name}: running (pid {record.pid}) with another configuration; restarting it")
            stop(record, grace_s=10)
        record = start_detached(argv, self._log(name))
        entry.update(process=record.to_json(), config=config, started_at=time.time())
        self._save(state)  # recorded at once: whatever happens next, `down` finds it
        self.progress(f"{name}: started (pid {record.pid}, log {self._log(name)})")

    def _wait_for_containerd(self, state: dict, ctr: Path) -> None:
        def answers() -> bool:
            return subprocess.run([str(ctr), "-a", str(self.layout.containerd_socket), "version"],
                                  capture_output=True, check=False, timeout=10).returncode == 0
        self._wait(state, "containerd answering", answers, timeout_s=30)

    def _wait(self, state: dict, what: str, done: Callable[[], bool], timeout_s: float = READY_TIMEOUT_S,
              explain: Callable[[], str] | None = None) -> None:
        started = time.monotonic()
        last_said = started
        while not done():
            for name, record in self._records(state).items():
                if name in self._started and not is_ours(record):
                    raise DevClusterError(f"{name} exited while waiting for {what}; its log ({self._log(name)}) "
                                          f"ends with:\n{_tail(self._log(name))}")
            now = time.monotonic()
            if now - started > timeout_s:
                detail = explain() if explain else f"the kubelet's log ends with:\n{_tail(self._log(KUBELET))}"
                raise DevClusterError(f"no {what} after {timeout_s:.0f}s; the components' logs are in "
                                      f"{self.state_dir / 'logs'}; {detail}")
            if now - last_said >= 10:
                self.progress(f"waiting for {what} ({now - started:.0f}s)")
                last_said = now
            time.sleep(0.25)

    # A plane kept over `down` keeps the Node's and the Pods' last statuses, Ready included, while their
    # containers are gone: readiness counts only when this kubelet said it, of containers that run now.

    def _node_ready(self, node: NodePlane, kubelet_since: float) -> bool:
        found = _kubectl_json(node, "get", "node", node.node_name)
        conditions = (found or {}).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   and _epoch(c.get("lastHeartbeatTime")) >= int(kubelet_since) for c in conditions)

    def _deployment_available(self, node: NodePlane, name: str) -> bool:
        found = _kubectl_json(node, "get", "deployment", name, "-n", nodeaddons.SYSTEM)
        status = (found or {}).get("status", {})
        if not (status.get("availableReplicas") and status.get("updatedReplicas") == status.get("replicas")):
            return False
        selector = ",".join(f"{k}={v}" for k, v in (found or {}).get("spec", {}).get("selector", {})
                            .get("matchLabels", {}).items())
        pods = (_kubectl_json(node, "get", "pods", "-n", nodeaddons.SYSTEM, "-l", selector) or {}).get("items", [])
        listed = subprocess.run(node.ctr_argv("tasks", "ls"), capture_output=True, text=True, check=False, timeout=30)
        running = {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.split()[-1:] == ["RUNNING"]}
        return any(
            any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions", []))
            and all(s.get("containerID", "").removeprefix("containerd://") in running
                    for s in pod.get("status", {}).get("containerStatuses", [{}]))
            for pod in pods)

    def _apply(self, plane: Plane, manifests: list[dict[str, Any]]) -> None:
        document = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
        done = subprocess.run([str(plane.kubectl), f"--kubeconfig={plane.kubeconfig}", "apply", "--server-side",
                               f"--field-manager={nodeaddons.FIELD_MANAGER}", "--force-conflicts", "-f", "-"],
                              input=document, capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise DevClusterError(f"applying the node's add-ons failed: {done.stderr.strip()}")

    def _records(self, state: dict | None = None) -> dict[str, ProcessRecord]:
        state = self._load() if state is None else state
        found = {}
        for name, entry in state.get("components", {}).items():
            record = ProcessRecord.of_entry(entry)
            if record is not None:
                found[name] = record
        return found

    def _log(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    def _load(self) -> dict:
        try:
            data = json.loads(self.layout.state_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as err:
            raise DevClusterError(f"{self.layout.state_file} is not valid JSON ({err}); remove it and run again") \
                from None
        return data if isinstance(data, dict) else {}

    def _save(self, state: dict) -> None:
        write_private(self.layout.state_file, json.dumps(state, indent=2) + "\n")


def _system_binary(name: str) -> Path:
    found = shutil.which(name) or next((str(p) for p in (Path("/usr/bin") / name, Path("/usr/sbin") / name)
                                        if p.is_file()), None)
    if found is None:
        raise DevClusterError(f"{name} was not found; a node needs containerd (and its client ctr): "
                              "apt-get install containerd")
    return Path(found)


def _same_ca_and_user(kubeconfig: Path, ca_pem: bytes, user: str, server: str) -> bool:
    """Whether a component's kubeconfig still fits the plane (its address and CA) and names the same user."""
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        return bool(cluster["server"] == server and config["users"][0]["name"] == user
                    and base64.b64decode(cluster["certificate-authority-data"]) == ca_pem)
    except (OSError, ValueError, KeyError, IndexError, TypeError, yaml.YAMLError):
        return False


def _kubectl_json(node: NodePlane, *args: str) -> dict | None:
    done = subprocess.run(node.kubectl_argv(*args, "-o", "json"), capture_output=True, text=True, check=False,
                          timeout=30)
    if done.returncode != 0:
        return None
    try:
        found = json.loads(done.stdout)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _epoch(timestamp: object) -> int:
    """Seconds since the epoch of an API timestamp (RFC 3339, UTC, whole seconds); 0 when there is none."""
    if not isinstance(timestamp, str):
        return 0
    try:
        return int(datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())
    except ValueError:
        return 0


def _deployment_logs(node: NodePlane, name: str) -> str:
    """What a Deployment's container said last, the likeliest reason it is not available."""
    said = []
    for previous in ("--previous=true", "--previous=false"):
        done = subprocess.run(node.kubectl_argv("logs", "-n", nodeaddons.SYSTEM, f"deployment/{name}", previous,
                                                "--tail=15"), capture_output=True, text=True, check=False, timeout=30)
        said.append(done.stdout.strip() or done.stderr.strip())
    pods = subprocess.run(node.kubectl_argv("get", "pods", "-n", nodeaddons.SYSTEM, "-o", "wide"),
                          capture_output=True, text=True, check=False, timeout=30).stdout
    return f"its Pods:\n{pods}\nits container's last words (previous run, then this one):\n" + "\n".join(said)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
