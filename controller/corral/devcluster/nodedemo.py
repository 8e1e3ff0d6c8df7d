"""`corral demo --node`: the whole product the way a k3s user runs it, on the real node of this machine.

The node (`corral dev up --node`), the Corral and broker images built here and imported into its containerd, the
chart installed by helm with `charts/corral/values-k3s.yaml` (the steps of the chart README's "Install on k3s":
namespace `corral` at the restricted Pod Security level, signing key and signed contracts, `helm install --wait`),
then a simulated home on this machine that connects only through the node's ports, an agent's token and a
person's. Stopping ends the simulated home; a node the demo started is taken down, one already running stays up
(with the release installed: the next run upgrades it).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from corral.client.apply import apply_yaml
from corral.devcluster import demosteps
from corral.devcluster.demosteps import Child
from corral.devcluster.errors import DevClusterError
from corral.devcluster.helmbinary import ensure_helm, helm_environment
from corral.devcluster.images import ensure_images, import_images
from corral.devcluster.images_corral import repository
from corral.devcluster.naming import name_devices
from corral.devcluster.node import COMPONENTS, DevNode, NodePlane
from corral.devcluster.plane import DevPlane
from corral.devcluster.processes import child_environment
from corral_sim.presets import overlay_of, preset

RELEASE = NAMESPACE = "corral"  # the chart README's release and namespace
MQTTS_PORT, GATEWAY_PORT, CONSOLE_PORT = 30883, 30800, 30880  # values-k3s.yaml's node ports
AGENT = "agent"  # the agent's ServiceAccount, as in `corral demo`
PERSON = "alice"  # the person who approves, as in the chart README
FIELD_MANAGER = "corral-demo"
HELM_TIMEOUT = "10m"  # the chart README's
HELM_OWNER_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class NodeReady:
    kubeconfig: Path
    node_name: str
    node_ip: str
    namespace: str
    devices: int
    agent_token: Path
    person: str
    person_token: Path
    broker_ca: Path
    helm: Path
    own_node: bool

    @property
    def mcp_url(self) -> str:
        return f"http://{self.node_ip}:{GATEWAY_PORT}/mcp"

    @property
    def console_url(self) -> str:
        return f"http://{self.node_ip}:{CONSOLE_PORT}/"

    @property
    def mqtt_url(self) -> str:
        return f"mqtts://{self.node_ip}:{MQTTS_PORT}"

    @property
    def env_file(self) -> Path:
        return self.kubeconfig.parent / "env"


def chart_dir() -> Path:
    return repository() / "charts" / "corral"


def image_values(images: Mapping[str, str]) -> list[str]:
    """The chart README's values for images built here (image name -> reference on the node): repository, tag and a
    pull policy that never pulls, for the Corral image and the broker's."""
    values = []
    for prefix, name in (("image", "corral"), ("mosquitto.image", "mosquitto")):
        repo, tag = images[name].rsplit(":", 1)
        values += [f"{prefix}.repository={repo}", f"{prefix}.tag={tag}", f"{prefix}.pullPolicy=Never"]
    return values


def chart_values(chart: Path, node_ip: str, images: Mapping[str, str], only_own_namespace: bool = False) -> list[str]:
    """The options choosing the values: the k3s file, the node's address and the images, as the README gives them;
    `only_own_namespace` also keeps the controller to the release namespace (see `NodeDemo._others_devices`)."""
    sets = [f"nodeAddress={node_ip}", *image_values(images)]
    if only_own_namespace:
        sets.append(f"controller.watchNamespaces={{{NAMESPACE}}}")
    return ["-f", str(chart / "values-k3s.yaml"), *(arg for value in sets for arg in ("--set", value))]


def helm_install_args(chart: Path, node_ip: str, images: Mapping[str, str],
                      only_own_namespace: bool = False) -> list[str]:
    """`helm install` of the chart README, as `upgrade --install`: a second run of the demo upgrades the release its
    first run left in the plane's etcd instead of failing on the name."""
    return ["upgrade", "--install", RELEASE, str(chart), "-n", NAMESPACE, *chart_values(chart, node_ip, images, only_own_namespace),
            "--wait", "--timeout", HELM_TIMEOUT]


def foreign_objects(existing: Iterable[Mapping[str, Any]], release: str = RELEASE,
                    namespace: str = NAMESPACE) -> tuple[list[Mapping[str, Any]], list[str]]:
    """Of the chart's objects already in the cluster: those made without helm (e.g. the roles and admission policies
    `corral demo` applied to the same plane), which the release may take over, and those of another release, which
    it must not (each described). A Namespace is left alone: the chart uses a kept people namespace as it is."""
    adopt: list[Mapping[str, Any]] = []
    conflicts: list[str] = []
    for item in existing:
        if item.get("kind") == "Namespace":
            continue
        annotations = item.get("metadata", {}).get("annotations") or {}
        owner = tuple(annotations.get(key) for key in HELM_OWNER_ANNOTATIONS)
        if owner == (release, namespace):
            continue
        if owner[0] is None:
            adopt.append(item)
        else:
            conflicts.append(f"{item.get('kind')} {item['metadata'].get('name')} (helm release {owner[0]} in "
                             f"namespace {owner[1]})")
    return adopt, conflicts


def pods_summary(pods: Iterable[Mapping[str, Any]]) -> str:
    """`controller 1/1, gateway 0/1 (ContainerCreating)`: Ready Pods by component, and why one is not."""
    counts: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    for pod in pods:
        component = pod.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component", "?")
        total = counts.setdefault(component, [0, 0])
        total[1] += 1
        status = pod.get("status", {})
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])):
            total[0] += 1
            continue
        for container in status.get("containerStatuses", []):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                reasons[component] = waiting["reason"]
    if not counts:
        return "no Pods yet"
    return ", ".join(f"{name} {ready}/{total}" + (f" ({reasons[name]})" if name in reasons else "")
                     for name, (ready, total) in sorted(counts.items()))


@dataclass
class NodeDemo:
    state_dir: Path
    progress: Progress
    children: list[Child] = field(default_factory=list)
    _node: DevNode | None = None  # set when this demo started the node: taken down on stop

    def start(self) -> NodeReady:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # the tokens, the signing key and the devices' passwords are in here
        logs = self.state_dir / "demo-logs"
        logs.mkdir(exist_ok=True)
        node = self._node_up()
        built = ensure_images(self.progress, names=["corral", "mosquitto"])
        import_images(str(node.ctr), node.containerd_socket, built.values(), self.progress)
        helm = ensure_helm(self.progress)
        admin = kubernetes.config.new_client_from_config(config_file=str(node.kubeconfig))
        self._restricted_namespace(admin)
        signed_build, _secret = demosteps.sign_firmware(admin, self.state_dir, NAMESPACE, self.progress)
        self._install(node, helm, {name: image.ref for name, image in built.items()})
        broker_ca = self._broker_ca(admin)
        devices = preset("home")
        credentials = demosteps.enroll(admin, NAMESPACE, devices, self.state_dir / "node-demo-credentials.json",
                                       self.progress)
        name_devices(admin, NAMESPACE, overlay_of("home"), FIELD_MANAGER)
        url = f"mqtts://{node.node_ip}:{MQTTS_PORT}"
        self.progress(f"starting {len(devices)} simulated devices on this machine, connecting to {url}")
        env = child_environment(os.environ, KUBECONFIG=str(node.kubeconfig))
        self.children.append(demosteps.spawn_corral(
            "sim", ["sim", "--preset", "home", "--mqtt", url, "--mqtt-ca", str(broker_ca), "--credentials",
                    str(credentials), "--signed-contracts", str(signed_build)], env, logs))
        agent_token = self._agent(admin)
        person_token = self._person(env)
        demosteps.wait_online(admin, NAMESPACE, len(devices), self.progress, self.check_children, timeout_s=180)
        return NodeReady(node.kubeconfig, node.node_name, node.node_ip, NAMESPACE, len(devices), agent_token, PERSON,
                         person_token, broker_ca, helm, own_node=self._node is not None)

    def _node_up(self) -> NodePlane:
        node = DevNode(self.state_dir, self.progress)
        running = {c.name for c in node.status() if c.running}
        if running >= set(COMPONENTS):
            self.progress(f"using the node already running from {self.state_dir}")
            return node.up()
        # Marked before up(): a half-started node is taken down too, and with it the plane (a plane that ran
        # without a node is restarted to serve one, so it is the demo's from then on).
        self._node = node
        plane_was_running = DevPlane(self.state_dir).running() is not None
        try:
            return node.up()
        except DevClusterError:
            if plane_was_running and not node.status():
                self._node = None  # refused before it started anything (e.g. another node runs): nothing to undo
            raise

    def _restricted_namespace(self, admin: kubernetes.client.ApiClient) -> None:
        label = {"pod-security.kubernetes.io/enforce": "restricted"}
        core = kubernetes.client.CoreV1Api(admin)
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE, "labels": label}})
        except kubernetes.client.ApiException as err:
            if err.status != 409:
                raise
            core.patch_namespace(NAMESPACE, {"metadata": {"labels": label}})
        self.progress(f"namespace {NAMESPACE}: Pod Security level restricted, enforced by the API server")

    def _install(self, node: NodePlane, helm: Path, images: Mapping[str, str]) -> None:
        chart = chart_dir()
        env = {**child_environment(os.environ, KUBECONFIG=str(node.kubeconfig)), **helm_environment(helm)}
        others = self._others_devices(node)
        if others:
            self.progress(f"Devices of earlier demos on this plane ({others}) share the simulated home's device ids: "
                          f"the chart's controller is kept to namespace {NAMESPACE} (controller.watchNamespaces)")
        self._take_over(node, helm, chart, env, images, bool(others))
        args = helm_install_args(chart, node.node_ip, images, bool(others))
        self.progress(f"helm {' '.join(args)}")
        log = self.state_dir / "demo-logs" / "helm.log"
        started = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(helm), *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            said, last_said = "", started
            while proc.poll() is None:
                time.sleep(2)
                now = self._pods(node)
                if now != said or time.monotonic() - last_said > 30:
                    self.progress(f"helm install --wait ({time.monotonic() - started:.0f}s): {now}")
                    said, last_said = now, time.monotonic()
        if proc.returncode != 0:
            raise DevClusterError(f"helm install failed ({proc.returncode}); its output ({log}):\n"
                                  f"{log.read_text(errors='replace')[-3000:]}")
        self.progress(f"helm install: every workload Ready in {time.monotonic() - started:.0f}s ({self._pods(node)})")

    def _others_devices(self, node: NodePlane) -> str:
        """Namespaces other than the release's holding Devices (`corral demo`'s `home` on the same plane), with how
        many: a controller watching them all would see two enrollments of each device id and honour neither."""
        done = subprocess.run(node.kubectl_argv("get", "devices.corral.dev", "-A", "-o", "json"), capture_output=True,
                              text=True, check=False, timeout=30)
        if done.returncode != 0:  # no CRD yet: a new plane
            return ""
        counts: dict[str, int] = {}
        for item in json.loads(done.stdout).get("items", []):
            namespace = item["metadata"]["namespace"]
            if namespace != NAMESPACE:
                counts[namespace] = counts.get(namespace, 0) + 1
        return ", ".join(f"{count} in {namespace}" for namespace, count in sorted(counts.items()))

    def _take_over(self, node: NodePlane, helm: Path, chart: Path, env: dict[str, str],
                   images: Mapping[str, str], only_own_namespace: bool) -> None:
        """Objects of the chart already on this plane but made without helm (`corral demo` applies the same roles and
        admission policies): marked as the release's, which helm then takes over; another release's are refused."""
        rendered = _run([str(helm), "template", RELEASE, str(chart), "-n", NAMESPACE, "--kube-version",
                         node.plane.version, *chart_values(chart, node.node_ip, images, only_own_namespace)], env,
                        "helm template")
        # Not Corral's own kinds (the chart's AuditCheckpoint): their CRDs may not exist yet, and nothing but a
        # release makes them in the release namespace.
        documents = [d for d in yaml.safe_load_all(rendered)
                     if d and not str(d.get("apiVersion", "")).startswith("corral.dev/")]
        existing: list[dict[str, Any]] = []
        by_namespace: dict[str, list[dict[str, Any]]] = {}
        for document in documents:  # kubectl takes one namespace a call (the chart writes some into kube-system)
            by_namespace.setdefault(document.get("metadata", {}).get("namespace") or NAMESPACE, []).append(document)
        for namespace, group in by_namespace.items():
            found = _run(node.kubectl_argv("get", "-n", namespace, "--ignore-not-found", "-o", "json", "-f", "-"),
                         env, "kubectl get (the chart's objects)",
                         stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": group}))
            existing += json.loads(found)["items"] if found.strip() else []
        adopt, conflicts = foreign_objects(existing)
        if conflicts:
            raise DevClusterError(f"objects of the chart on this plane belong to another helm release: "
                                  f"{'; '.join(conflicts)}. Uninstall that release (helm uninstall NAME -n NAMESPACE) "
                                  f"or use another --state-dir")
        if not adopt:
            return
        names = ", ".join(f"{i['kind']} {i['metadata']['name']}" for i in adopt)
        self.progress(f"the release takes over {len(adopt)} objects made without helm on this plane: {names}")
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": i["apiVersion"], "kind": i["kind"], "metadata": {
                "name": i["metadata"]["name"], **({"namespace": i["metadata"]["namespace"]}
                                                  if "namespace" in i["metadata"] else {})}} for i in adopt]})
        _run(node.kubectl_argv("label", "--overwrite", "-f", "-", "app.kubernetes.io/managed-by=Helm"), env,
             "kubectl label", stdin=listed)
        _run(node.kubectl_argv("annotate", "--overwrite", "-f", "-", f"{HELM_OWNER_ANNOTATIONS[0]}={RELEASE}",
                               f"{HELM_OWNER_ANNOTATIONS[1]}={NAMESPACE}"), env, "kubectl annotate", stdin=listed)

    def _pods(self, node: NodePlane) -> str:
        done = subprocess.run(node.kubectl_argv("get", "pods", "-n", NAMESPACE, "-l",
                                                f"app.kubernetes.io/instance={RELEASE}", "-o", "json"),
                              capture_output=True, text=True, check=False, timeout=30)
        if done.returncode != 0:
            return "Pods not readable yet"
        return pods_summary(json.loads(done.stdout).get("items", []))

    def _broker_ca(self, admin: kubernetes.client.ApiClient) -> Path:
        """The broker's CA from the Secret the chart made (`kubectl get secret corral-mosquitto-ca ...`)."""
        secret = kubernetes.client.CoreV1Api(admin).read_namespaced_secret(f"{RELEASE}-mosquitto-ca", NAMESPACE)
        path = self.state_dir / "node-broker-ca.crt"
        path.write_bytes(base64.b64decode(secret.data["ca.crt"]))
        return path

    def _agent(self, admin: kubernetes.client.ApiClient) -> Path:
        """A ServiceAccount bound to corral-agent-operator, and its token for the gateway's audience."""
        rbac = "rbac.authorization.k8s.io"
        apply_yaml(admin, yaml.safe_dump_all([
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": AGENT, "namespace": NAMESPACE}},
            {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {"name": f"demo-{AGENT}",
                                                                              "namespace": NAMESPACE},
             "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": f"{RELEASE}-agent-operator"},
             "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}]},
        ]), NAMESPACE, field_manager=FIELD_MANAGER, force=True)
        return demosteps.agent_token(admin, NAMESPACE, AGENT, self.state_dir / "node-agent-token")

    def _person(self, env: dict[str, str]) -> Path:
        """`corral people add alice -n corral --write FILE`, as the chart README does."""
        path = self.state_dir / f"{PERSON}-token"
        _run([*_corral(), "people", "add", PERSON, "-n", NAMESPACE, "--write", str(path)], env,
             f"corral people add {PERSON}")
        self.progress(f"{PERSON} may approve in {NAMESPACE}; the token to sign in with is in {path}")
        return path

    def check_children(self) -> None:
        demosteps.check_children(self.children)

    def stop(self) -> None:
        demosteps.stop_uninterrupted(self.children, self.progress)
        if self._node is not None:
            self.progress("taking down the node the demo started (the release stays in the plane's etcd)")
            for line in self._node.down():
                self.progress(line)
            self._node = None


def _corral() -> list[str]:
    return [sys.executable, "-m", "corral.cli.main"]


def _run(argv: list[str], env: dict[str, str], what: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        raise DevClusterError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout
