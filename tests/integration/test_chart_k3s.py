"""The chart as a k3s user installs it: charts/corral/values-k3s.yaml and the chart README's "Install on k3s".

Rendered: the values file lints strictly; the broker, the gateway and the approval page are on the node ports the
README names; the one address the user sets (nodeAddress) is in the broker certificate's names, the gateway's
accepted hosts and public URL and the approval page's URL, and an exposed broker or gateway without it is refused
with a message that names it; the NetworkPolicies admit connections arriving through a NodePort from the LAN to
the gateway, the approval page and the broker's TLS port, and no Pod of another namespace to the broker or the
controller's audit server.

Installed (a local plane of its own: no node, so no Pod runs, but Helm's objects are stored, which is what
ownership is about): `helm uninstall` leaves of the chart's objects exactly what the README says, and a new
install then succeeds under another release name and under the same one again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from corral.devcluster.plane import DevPlane
from tests.chart_readme import CHART_README, k3s_install_commands, uninstall_leaves
from tests.harness import api_client
from tests.helm_harness import KUBE_VERSION, Helm, helm_binary
from tests.network_policy import Source, Target, admits

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "corral"
VALUES = CHART / "values-k3s.yaml"
RELEASE, NAMESPACE = "corral", "corral"  # as the README installs it
NODE = "192.168.1.10"
PORTS = {"mosquitto": 30883, "gateway": 30800, "console": 30880}
POD_CIDR = "10.42.0.0/16"  # k3s's default cluster CIDR, which values-k3s.yaml names


@pytest.fixture(scope="module")
def helm(request: pytest.FixtureRequest) -> Helm:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    return Helm(helm_binary(lambda line: reporter.write_line(f"[helm] {line}") if reporter else print(line)))


def k3s_args(*sets: str, node: str | None = NODE) -> list[str]:
    """-f values-k3s.yaml with nodeAddress (unless None) and `sets`."""
    args = ["-f", str(VALUES)]
    for value in ([f"nodeAddress={node}"] if node is not None else []) + list(sets):
        args += ["--set", value]
    return args


def render(helm: Helm, *sets: str, node: str | None = NODE) -> list[dict[str, Any]]:
    done = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION, *k3s_args(*sets, node=node))
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def args_of(docs: list[dict[str, Any]], component: str, init: bool = False) -> list[str]:
    pod = workload(docs, component)["spec"]["template"]["spec"]
    return list(pod["initContainers" if init else "containers"][0]["args"])


def workload(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    """The component's Deployment, or the controller's StatefulSet."""
    return next(d for d in docs if d and d["kind"] in ("Deployment", "StatefulSet")
                and d["metadata"]["name"] == f"{RELEASE}-{component}")


def options(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == name]


def test_the_k3s_values_lint_strictly_and_turn_on_what_the_readme_says(helm: Helm) -> None:
    done = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, *k3s_args())
    assert "0 chart(s) failed" in done.stdout, done.stdout
    docs = render(helm)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", f"{RELEASE}-{c}") for c in ("gateway", "mosquitto", "console")} <= kinds
    assert ("StatefulSet", f"{RELEASE}-controller") in kinds
    assert {("NetworkPolicy", f"{RELEASE}-{c}") for c in ("controller", "gateway", "mosquitto", "console")} <= kinds
    assert "--signing-keys" in args_of(docs, "controller") and "--require-signatures" in args_of(docs, "controller")
    claims = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert set(claims) == {f"{RELEASE}-gateway-audit"}, "the controller's are its StatefulSet's, one per ordinal"
    claims |= {t["metadata"]["name"]: t["spec"] for t in workload(docs, "controller")["spec"]["volumeClaimTemplates"]}
    assert all("storageClassName" not in spec for spec in claims.values()), "the default class: k3s's local-path"


def test_the_services_are_on_the_node_ports_the_readme_names(helm: Helm) -> None:
    docs = render(helm)
    for component, node_port in PORTS.items():
        service = find(docs, "Service", f"{RELEASE}-{component}")["spec"]
        assert service["type"] == "NodePort", component
        assert [p["nodePort"] for p in service["ports"]] == [node_port], component
    readme = CHART_README.read_text().split("## Install on k3s", 1)[1].split("\n## ", 1)[0]
    assert "mqtts://$NODE:30883" in " ".join(k3s_install_commands())
    assert "http://$NODE:30800/mcp" in readme and "http://$NODE:30880/" in readme
    for port in PORTS.values():
        assert 30000 <= port <= 32767, "Kubernetes' default NodePort range"


@pytest.mark.parametrize("node, host", [(NODE, NODE), ("corral.lan", "corral.lan"), ("fd00::10", "[fd00::10]")])
def test_the_node_address_is_where_devices_agents_and_browsers_are_expected(helm: Helm, node: str, host: str) -> None:
    docs = render(helm, node=node)
    gateway = args_of(docs, "gateway")
    assert f"{host}:30800" in options(gateway, "--allowed-host")
    assert options(gateway, "--public-url") == [f"http://{host}:30800/mcp"]
    assert options(args_of(docs, "console"), "--public-url") == [f"http://{host}:30880/"]
    (broker,) = [v for v in options(args_of(docs, "controller", init=True), "--server-cert")
                 if v.startswith(f"{RELEASE}-mosquitto-tls=")]
    assert node in broker.split("=", 1)[1].split(","), broker
    assert f"{RELEASE}-mosquitto.{NAMESPACE}.svc" in broker.split("=", 1)[1].split(","), "in-cluster names stay"


def test_an_exposed_broker_or_gateway_without_the_node_address_is_refused(helm: Helm) -> None:
    done = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION, *k3s_args(node=None),
                check=False)
    assert done.returncode != 0 and "nodeAddress is empty" in done.stderr and "mosquitto.service.type" in done.stderr
    # The broker named by a name of your own: then the gateway is what needs the address.
    done = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION,
                *k3s_args("mosquitto.tls.extraNames={broker.lan}", node=None), check=False)
    assert done.returncode != 0 and "gateway.service.type" in done.stderr and "421" in done.stderr, done.stderr
    done = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION,
                *k3s_args("nodeAddress=http://192.168.1.10:30800", node=None), check=False)
    assert done.returncode != 0 and "nodeAddress" in done.stderr, "a URL is not an address"
    # Not exposed: no address needed, none used.
    inside = render(helm, "mosquitto.service.type=ClusterIP", "gateway.service.type=ClusterIP",
                    "console.service.type=ClusterIP", node=None)
    assert options(args_of(inside, "gateway"), "--public-url") == [f"http://{RELEASE}-gateway.{NAMESPACE}.svc:8000/mcp"]
    assert "--public-url" not in args_of(inside, "console")


def labels_of(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    labels: dict[str, str] = workload(docs, component)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_policies_admit_the_lan_through_node_ports_and_keep_other_pods_out(helm: Helm) -> None:
    docs = render(helm, "mosquitto.plainListener=true")
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    lan = Source("192.168.1.20")  # a phone, a device, an agent's machine: through a NodePort, its own address
    node = Source(NODE)  # a process on the node, the API server among them
    stranger = Source("10.42.0.77", "other", {"app": "curious"}, {"kubernetes.io/metadata.name": "other"})
    neighbour = Source("10.42.0.78", NAMESPACE, {"app": "other"}, {"kubernetes.io/metadata.name": NAMESPACE})
    controller = Source("10.42.0.79", NAMESPACE, labels_of(docs, "controller"),
                        {"kubernetes.io/metadata.name": NAMESPACE})

    def to(component: str, port: int) -> Target:
        return Target(NAMESPACE, labels_of(docs, component), port)

    for target in (to("gateway", 8000), to("console", 8080), to("mosquitto", 8883)):
        assert admits(policies, lan, target), target
        assert admits(policies, node, target), target
    assert admits(policies, controller, to("mosquitto", 8883))
    assert admits(policies, node, to("controller", 8443)), "the API server proxies the readings API to it"
    for source in (stranger, neighbour):
        assert admits(policies, source, to("gateway", 8000)), "agents in the cluster, with their tokens"
        for target in (to("mosquitto", 8883), to("mosquitto", 1883), to("controller", 8443)):
            assert not admits(policies, source, target), (source, target)
    # The values file names the cluster CIDR once; the rendered policies carry it wherever it matters.
    blocks = [peer["ipBlock"] for p in policies for rule in p["spec"]["ingress"] for peer in rule.get("from", [])
              if "ipBlock" in peer]
    assert blocks and all(block["except"] == [POD_CIDR] for block in blocks)


def test_the_readme_install_is_a_block_a_test_can_run() -> None:
    commands = k3s_install_commands("10.1.2.3", ["image.repository=corral.local/corral", "image.pullPolicy=Never"])
    assert commands[0] == "NODE=10.1.2.3"
    (install,) = [c for c in commands if c.startswith("helm install ")]
    assert "-f charts/corral/values-k3s.yaml" in install and "--set nodeAddress=$NODE" in install
    assert install.endswith("--set image.repository=corral.local/corral --set image.pullPolicy=Never")
    assert "pod-security.kubernetes.io/enforce=restricted" in " ".join(commands)
    assert re.search(r"corral contracts keygen .*--secret corral/corral-signing-keys", " ".join(commands))
    assert any(c.startswith("corral devices enroll ") for c in commands)


# --- installed: ownership of what the chart keeps --------------------------------------------------------------


@pytest.fixture(scope="module")
def plane_helm(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Helm, kubernetes.client.ApiClient]]:
    """Helm on a local plane of its own: the chart's cluster-wide objects (admission policies, the APIService)
    have fixed names, so no other test's plane may hold them."""
    dev = DevPlane(tmp_path_factory.mktemp("k3s-chart-plane"), progress=lambda line: None)
    plane = dev.up()
    try:
        admin = api_client(plane)
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": NAMESPACE}})
        yield Helm(helm.binary, plane.kubeconfig), admin
    finally:
        dev.down(purge=True)


def manifest(helm: Helm, release: str) -> dict[tuple[str, str], str]:
    """(kind, name) -> apiVersion of every object of the release."""
    docs = yaml.safe_load_all(helm("get", "manifest", release, "-n", NAMESPACE).stdout)
    return {(d["kind"], d["metadata"]["name"]): d["apiVersion"] for d in docs if d}


def present(admin: kubernetes.client.ApiClient, api_version: str, kind: str, name: str) -> bool:
    resource = DynamicClient(admin).resources.get(api_version=api_version, kind=kind)
    try:
        DynamicClient(admin).get(resource, name=name, namespace=NAMESPACE if resource.namespaced else None)
    except NotFoundError:
        return False
    return True


def owner_of(admin: kubernetes.client.ApiClient, namespace: str) -> str | None:
    annotations = kubernetes.client.CoreV1Api(admin).read_namespace(namespace).metadata.annotations or {}
    return annotations.get("meta.helm.sh/release-name")


def test_uninstall_leaves_what_the_readme_says_and_any_release_installs_again(
        plane_helm: tuple[Helm, kubernetes.client.ApiClient]) -> None:
    helm, admin = plane_helm
    helm("install", RELEASE, str(CHART), "-n", NAMESPACE, *k3s_args())
    first = manifest(helm, RELEASE)
    assert ("Namespace", "corral-people") in first and owner_of(admin, "corral-people") == RELEASE

    helm("uninstall", RELEASE, "-n", NAMESPACE)
    stayed = {obj for obj, api_version in first.items() if present(admin, api_version, *obj)}
    said = {obj for obj in uninstall_leaves(RELEASE) if obj[0] != "CustomResourceDefinition"}
    made_by_helm = {obj for obj in said if obj in first}  # the audit keys are made at run time, not by Helm
    assert stayed == made_by_helm, f"left {sorted(stayed)}, the README says {sorted(made_by_helm)}"
    assert owner_of(admin, "corral-people") == RELEASE, "kept as it was: still naming the old release"

    # Another release name: the kept namespace is used, not rendered (Helm would refuse an object it does not own).
    helm("install", "other", str(CHART), "-n", NAMESPACE, *k3s_args())
    other = manifest(helm, "other")
    assert ("Namespace", "corral-people") not in other
    assert {("PersistentVolumeClaim", "other-corral-gateway-audit"), ("StatefulSet", "other-corral-controller")} <= other.keys()
    helm("uninstall", "other", "-n", NAMESPACE)

    # The same fullname under another release name: the kept claims are the same record, used as they are.
    helm("install", "again", str(CHART), "-n", NAMESPACE, *k3s_args("fullnameOverride=corral"))
    again = manifest(helm, "again")
    assert not {obj for obj in again if obj[0] == "PersistentVolumeClaim"}
    docs = yaml.safe_load_all(helm("get", "manifest", "again", "-n", NAMESPACE).stdout)
    gateway = next(d for d in docs if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "corral-gateway")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in gateway["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == [f"{RELEASE}-gateway-audit"]
    helm("uninstall", "again", "-n", NAMESPACE)

    # A people namespace made by hand (or by `corral people add`): no release owns it, none takes it.
    kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": "household"}})
    helm("install", "hand", str(CHART), "-n", NAMESPACE, *k3s_args("policy.people.namespace=household"))
    assert ("Namespace", "household") not in manifest(helm, "hand") and owner_of(admin, "household") is None
    helm("uninstall", "hand", "-n", NAMESPACE)

    # The first name again: Helm takes its kept objects over.
    helm("install", RELEASE, str(CHART), "-n", NAMESPACE, *k3s_args())
    assert {("Namespace", "corral-people"), ("PersistentVolumeClaim", f"{RELEASE}-gateway-audit")} <= manifest(helm, RELEASE).keys()
    assert helm.status(RELEASE, NAMESPACE)["info"]["status"] == "deployed"
