"""The Helm chart: lint, template, install into a real API server, and least privilege proven both ways.

The local plane runs no Pods, so the installed workloads never start. Instead the test takes the
controller's arguments from the rendered StatefulSet and runs `corral` with exactly those (its pod's name where
Kubernetes would expand $(POD_NAME)), as the
chart's controller ServiceAccount (a token minted for it): the end-to-end Intent flow then shows the
ClusterRole is sufficient, and refused requests with the same token show it is minimal. The pod's mounted
files (the audit signing key, the serving certificate) are the installed Secrets' contents, written where
the test can give them; the gateway is run the same way, to publish its audit checkpoint with its one right.
"""

from __future__ import annotations

import base64
import getpass
import gzip
import json
import os
import re
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import kubernetes
import paho.mqtt.client as paho
import pytest
import yaml
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.api.codes import GROUP, PEOPLE_NAMESPACE, VERSION
from corral.api.roles import USER_ROLE_RULES
from corral.cli.main import cli
from corral.client.intents import decide_on, submit, wait_settled
from corral.client.own_secrets import ensure_secret
from corral.client.secret_material import Wanted, certificate_names
from corral.devcluster import broker, files
from corral.devcluster.plane import DevPlane, Plane, find_mosquitto
from corral.devcluster.processes import accepts_connections, free_port
from tests.broker_harness import dynsec_at
from tests.chart_readme import controller_rights
from tests.controller_harness import CORRAL
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import kubeconfig_for
from tests.harness import (
    api_client,
    ensure_people_namespace,
    healthz,
    service_account_token,
    wait_for,
    wait_until_allowed,
)
from tests.helm_harness import KUBE_VERSION, Helm, helm_binary
from tests.mqtt5_harness import Account, client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "corral"
RELEASE, SYSTEM, HOME = "corral", "corral-system", "home"
# The controller's first pod: what $(POD_NAME) in its rendered arguments becomes when this test runs them, and
# the name of the AuditCheckpoint object that pod publishes to (one per pod: one audit chain per ordinal).
POD = f"{RELEASE}-controller-0"
CONTROLLER_CHECKPOINT = f"corral-controller-{POD}"


@pytest.fixture(scope="module")
def helm(request: pytest.FixtureRequest) -> Helm:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    return Helm(helm_binary(lambda line: reporter.write_line(f"[helm] {line}") if reporter else print(line)))


# The chart requires contract signatures by default; most variants here are about something else.
UNSIGNED = "signing.require=false"


def test_the_readings_are_an_aggregated_api_served_by_the_controller_with_its_serving_ca(helm: Helm) -> None:
    """The APIService names the controller's Service; its caBundle is not rendered (the CA is made at run time):
    the init container publishes the serving CA there (installed: test_the_init_container_makes_...)."""
    docs = render(helm)
    service = find(docs, "APIService", "v1alpha1.readings.corral.dev")["spec"]
    assert service["service"] == {"name": f"{RELEASE}-controller", "namespace": SYSTEM, "port": 8443}
    assert "caBundle" not in service
    assert options(init_of(docs), "--publish-ca") == [f"{RELEASE}-controller-serving=configmap/{RELEASE}-controller-serving-ca",
                                                     f"{RELEASE}-controller-serving=apiservice/v1alpha1.readings.corral.dev"]
    assert "--requestheader-from-cluster" in container_of(docs, "controller")["args"]
    reader = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"].get("namespace") == "kube-system")
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"


def render(helm: Helm, *sets: str) -> list[dict[str, Any]]:
    """The rendered documents; unsigned contracts unless `sets` say otherwise (a later --set wins)."""
    args = ["template", RELEASE, str(CHART), "-n", SYSTEM, "--kube-version", KUBE_VERSION]
    for value in (UNSIGNED, *sets):
        args += ["--set", value]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def workload(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    """The component's Deployment, or the controller's StatefulSet."""
    return next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                and d["metadata"]["name"] == f"{RELEASE}-{component}")


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def container_of(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    container: dict[str, Any] = workload(docs, component)["spec"]["template"]["spec"]["containers"][0]
    return container


def init_of(docs: list[dict[str, Any]]) -> list[str]:
    """The arguments of the controller pod's init container, `corral secrets ensure ...`."""
    (init,) = pod_of(docs, "controller")["initContainers"]
    assert init["name"] == "secrets" and init["args"][:2] == ["secrets", "ensure"]
    return list(init["args"])


def options(args: list[str], name: str) -> list[str]:
    """Every value of a repeated option."""
    return [args[i + 1] for i, arg in enumerate(args) if arg == name]


def pod_of(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    pod: dict[str, Any] = workload(docs, component)["spec"]["template"]["spec"]
    return pod


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


POD_PATHS = ("/etc/corral/", "/var/lib/corral/")


def localized(args: list[str], root: Path, files: dict[str, bytes] | None = None) -> list[str]:
    """The arguments with the pod's paths (its mounts) under `root`; a mounted file gets `files[path]`, or is
    left empty (enough for the argument parser, which only looks that it exists)."""
    out = []
    for arg in expanded(args):
        if arg.startswith(POD_PATHS):
            local = root / arg.lstrip("/")
            if arg.startswith("/etc/corral/"):
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_bytes((files or {}).get(arg, b""))
            arg = str(local)
        out.append(arg)
    return out


def expanded(args: list[str], pod: str = POD) -> list[str]:
    """The arguments as Kubernetes hands them to the container: $(POD_NAME) and $(POD_NAMESPACE) expanded."""
    return [arg.replace("$(POD_NAME)", pod).replace("$(POD_NAMESPACE)", SYSTEM) for arg in args]


def test_helm_lint_passes_strictly(helm: Helm) -> None:
    done = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION)
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("sets", [
    (), ("mosquitto.enabled=true",), ("metrics.enabled=true", "metrics.serviceMonitor.enabled=true"),
    ("networkPolicy.enabled=true",), ("controller.watchNamespaces={a,b}",),
    ("signing.require=true", "signing.keysSecret=keys"), ("mqtt.username=u", "mqtt.password=p@ss"),
    ("mosquitto.enabled=true", "mosquitto.plainListener=true", "mqtt.manageAccounts=true"),
    ("audit.persistence.enabled=false", "gateway.replicas=3", "audit.gatewayPersistence.enabled=false"),
    ("audit.existingKeySecret=mine", "audit.serving.existingSecret=tls", "audit.persistence.existingClaim=pvc",
     "controller.replicas=1"),
    ("console.enabled=true", "notifications.webhooks[0].name=phone", "notifications.webhooks[0].kind=ntfy",
     "notifications.webhooks[0].secretName=ntfy"),
])
def test_every_variant_renders_restricted_workloads(helm: Helm, sets: tuple[str, ...]) -> None:
    docs = render(helm, *sets)
    deployments = workloads(docs)
    assert deployments and workload(docs, "controller")["kind"] == "StatefulSet"
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"]
        for container in pod["containers"]:
            assert container["livenessProbe"] and container["readinessProbe"]


@pytest.mark.parametrize("sets", [
    (), ("metrics.enabled=true", "gateway.deviceTools=true"), ("controller.watchNamespaces={a,b}",),
    ("signing.require=true", "signing.keysSecret=keys", "policy.approvals.medium=0", "telemetry.deadbands.rssi=5"),
    ("audit.checkpointInterval=60", "audit.servePort=9443", "gateway.replicas=2", "audit.gatewayPersistence.enabled=false"),
    ("console.enabled=true", "policy.people.namespace=household",
     "policy.people.approverServiceAccounts={ops/pager}"),
])
def test_the_rendered_arguments_are_ones_corral_accepts(helm: Helm, sets: tuple[str, ...], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("CORRAL_MQTT_URL", "CORRAL_MQTT_PASSWORD_FILE"):
        monkeypatch.delenv(key, raising=False)  # the rendered arguments alone say everything
    for deployment in workloads(render(helm, *sets)):
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"] + pod.get("initContainers", []):
            args = container.get("args") or []
            if container.get("command") or not args or args[0] not in ("run", "mcp", "console", "secrets"):
                continue  # not a corral container (the bundled Mosquitto)
            command = cli.commands[args[0]]
            if isinstance(command, click.Group):  # corral secrets ensure
                command, args = command.commands[args[1]], args[1:]
            # raises a UsageError on anything corral refuses (the mounted files must exist: --serve-cert)
            command.make_context(args[0], localized(list(args[1:]), tmp_path))


def test_the_bridge_renders_with_its_own_account_rights_and_arguments_corral_accepts(helm: Helm,
                                                                                     tmp_path: Path) -> None:
    """bridge.enabled: a restricted Deployment running `corral bridge run` with arguments it accepts, a Role in the
    device namespace with exactly the bridge's rights, and its broker password made at run time by the controller's
    init container (labelled for the controller's account keeping), which the controller may read back."""
    refused = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", UNSIGNED,
                   "--set", "bridge.enabled=true", check=False)
    assert refused.returncode != 0 and "bridge.enabled needs the bundled broker" in refused.stderr
    docs = render(helm, "bridge.enabled=true", "mosquitto.enabled=true", "networkPolicy.enabled=true",
                  "controller.deviceNamespace=home")
    pod = pod_of(docs, "bridge")
    assert pod["serviceAccountName"] == f"{RELEASE}-bridge" and pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["capabilities"]["drop"] == ["ALL"]
    args = container["args"]
    assert args[:2] == ["bridge", "run"] and options(args, "--namespace") == [HOME]
    assert options(args, "--mqtt") == [f"mqtts://corral-bridge@{RELEASE}-mosquitto:8883"]
    bridge_run = cli.commands["bridge"]
    assert isinstance(bridge_run, click.Group)
    bridge_run.commands["run"].make_context("run", localized(list(args[2:]), tmp_path))
    role = find(docs, "Role", f"{RELEASE}-bridge")
    assert role["metadata"]["namespace"] == HOME
    assert role["rules"] == [
        {"apiGroups": ["corral.dev"], "resources": ["discovereddevices"],
         "verbs": ["get", "list", "watch", "create", "patch"]},
        {"apiGroups": ["corral.dev"], "resources": ["devices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}]
    binding = find(docs, "RoleBinding", f"{RELEASE}-bridge")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-bridge", "namespace": SYSTEM}]
    init = next(c for c in pod_of(docs, "controller")["initContainers"] if c["name"] == "bridge-secret")
    assert options(init["args"], "--password") == [f"{RELEASE}-bridge-broker/password"]
    assert {"corral.dev/bridge=account", f"corral.dev/bridge-namespace={HOME}"} <= set(options(init["args"], "--label"))
    ensure = cli.commands["secrets"]
    assert isinstance(ensure, click.Group)
    ensure.commands["ensure"].make_context("ensure", list(init["args"][2:]))
    own = find(docs, "Role", f"{RELEASE}-controller-own-secrets")
    assert f"{RELEASE}-bridge-broker" in own["rules"][1]["resourceNames"]
    volume = next(v for v in pod["volumes"] if v["name"] == "mqtt-password")
    assert volume["secret"]["secretName"] == f"{RELEASE}-bridge-broker"
    policy = find(docs, "NetworkPolicy", f"{RELEASE}-bridge")
    assert policy["spec"]["ingress"] == []
    # The controller reads the bridge's Secret in the release namespace, watched namespaces or not.
    narrowed = render(helm, "bridge.enabled=true", "mosquitto.enabled=true", "controller.watchNamespaces={a}",
                      "controller.deviceNamespace=home")
    assert options(container_of(narrowed, "controller")["args"], "--watch-namespace") == ["a", HOME, SYSTEM]
    # Bridge and source Secrets make broker accounts only from the release and the device namespace (issue 41,
    # finding 3), or the namespaces named; those are watched.
    assert options(container_of(narrowed, "controller")["args"], "--bridge-namespace") == [SYSTEM, HOME]
    named = render(helm, "bridge.enabled=true", "mosquitto.enabled=true", "controller.watchNamespaces={a}",
                   "controller.bridgeNamespaces={bridges}")
    args = container_of(named, "controller")["args"]
    assert options(args, "--bridge-namespace") == ["bridges"] and "bridges" in options(args, "--watch-namespace")


def test_the_default_install_requires_signed_contracts(helm: Helm) -> None:
    done = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, check=False)
    assert done.returncode != 0
    assert "signing.keysSecret is empty" in done.stderr and "signing.require=false" in done.stderr, done.stderr
    signed = render(helm, "signing.require=true", "signing.keysSecret=keys")
    args = container_of(signed, "controller")["args"]
    assert "--require-signatures" in args


def test_the_default_install_runs_two_controller_replicas_that_elect_a_leader(helm: Helm) -> None:
    """A StatefulSet of 2 (Parallel, RollingUpdate) behind a PodDisruptionBudget of maxUnavailable 1, each pod
    named by the downward API and leading through Leases in the release namespace with client-go's timings."""
    docs = render(helm)
    controller = workload(docs, "controller")
    assert controller["kind"] == "StatefulSet"
    spec = controller["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"], spec["updateStrategy"]) == (
        2, "Parallel", {"type": "RollingUpdate"})
    assert spec["serviceName"] == f"{RELEASE}-controller-pods"
    headless = find(docs, "Service", f"{RELEASE}-controller-pods")["spec"]
    assert headless["clusterIP"] == "None" and headless["selector"] == spec["selector"]["matchLabels"]
    budget = find(docs, "PodDisruptionBudget", f"{RELEASE}-controller")["spec"]
    assert budget == {"maxUnavailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}
    container = container_of(docs, "controller")
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]} == {
        "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    args = container["args"]
    assert "--leader-elect" in args and "--identity" not in args, "the identity is the pod's name plus a process id"
    assert {f: flag(args, f) for f in ("--lease-namespace", "--lease-prefix", "--shards", "--lease-duration",
                                      "--renew-deadline", "--retry-period")} == {
        "--lease-namespace": SYSTEM, "--lease-prefix": f"{RELEASE}-controller", "--shards": "1",
        "--lease-duration": "15", "--renew-deadline": "10", "--retry-period": "2"}
    role = find(docs, "Role", f"{RELEASE}-controller-leader-election")
    assert role["metadata"]["namespace"] == SYSTEM and role["rules"] == [{
        "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
        "verbs": ["get", "list", "watch", "create", "update"]}]
    binding = find(docs, "RoleBinding", f"{RELEASE}-controller-leader-election")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-controller", "namespace": SYSTEM}]


def test_the_leader_election_values_reach_the_controller(helm: Helm) -> None:
    docs = render(helm, "controller.replicas=3", "controller.shards=8", "controller.leaderElection.leaseDurationSeconds=6",
                  "controller.leaderElection.renewDeadlineSeconds=4", "controller.leaderElection.retryPeriodSeconds=1",
                  "controller.leaderElection.leasePrefix=home-ctl", "controller.podDisruptionBudget.maxUnavailable=2",
                  "mosquitto.enabled=true")
    assert workload(docs, "controller")["spec"]["replicas"] == 3
    args = container_of(docs, "controller")["args"]
    assert [flag(args, f) for f in ("--lease-prefix", "--shards", "--lease-duration", "--renew-deadline",
                                    "--retry-period")] == ["home-ctl", "8", "6", "4", "1"]
    assert find(docs, "PodDisruptionBudget", f"{RELEASE}-controller")["spec"]["maxUnavailable"] == 2
    pods = [f"{RELEASE}-controller-{i}" for i in range(3)]
    # Per pod: its broker account, its checkpoint object (and the right to it), its DNS name in the certificate.
    assert options(pod_of(docs, "mosquitto")["initContainers"][0]["args"], "--controller-username") == pods
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "AuditCheckpoint") == sorted(
        [f"corral-controller-{pod}" for pod in pods] + ["corral-gateway"])
    assert find(docs, "Role", f"{RELEASE}-controller-audit-checkpoint")["rules"][0]["resourceNames"] == [
        f"corral-controller-{pod}" for pod in pods]
    names = options(init_of(docs), "--server-cert")[0].split("=", 1)[1].split(",")
    assert {f"{pod}.{RELEASE}-controller-pods.{SYSTEM}.svc" for pod in pods} <= set(names)
    assert not [d for d in render(helm, "controller.podDisruptionBudget.enabled=false")
                if d["kind"] == "PodDisruptionBudget"]


def assert_refused(helm: Helm, sets: tuple[str, ...], refusal: str) -> None:
    """`helm template` with these --set values fails, saying `refusal`."""
    args = ["template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", UNSIGNED]
    for value in sets:
        args += ["--set", value]
    done = helm(*args, check=False)
    assert done.returncode != 0 and refusal in done.stderr, done.stderr


@pytest.mark.parametrize(("sets", "refusal"), [
    (("controller.leaderElection.renewDeadlineSeconds=15",), "must be below leaseDurationSeconds"),
    (("controller.leaderElection.retryPeriodSeconds=9",), "more than 1.2 x retryPeriodSeconds"),
    (("audit.persistence.existingClaim=mine",), "audit.persistence.existingClaim gives every controller pod ONE"),
    (("controller.replicas=0",), "values don't meet the specifications of the schema"),
    (("controller.leaderElection.leasePrefix=Not_A_Name",), "values don't meet the specifications of the schema"),
])
def test_leader_election_settings_that_cannot_work_are_refused(helm: Helm, sets: tuple[str, ...], refusal: str) -> None:
    assert_refused(helm, sets, refusal)


def test_one_replica_may_keep_an_existing_audit_claim(helm: Helm) -> None:
    docs = render(helm, "controller.replicas=1", "audit.persistence.existingClaim=mine")
    spec = workload(docs, "controller")["spec"]
    assert "volumeClaimTemplates" not in spec and "persistentVolumeClaimRetentionPolicy" not in spec
    assert {v["name"]: v for v in pod_of(docs, "controller")["volumes"]}["audit"] == {
        "name": "audit", "persistentVolumeClaim": {"claimName": "mine"}}
    gone = render(helm, "audit.persistence.enabled=false")
    assert "volumeClaimTemplates" not in workload(gone, "controller")["spec"]
    assert {v["name"]: v for v in pod_of(gone, "controller")["volumes"]}["audit"] == {"name": "audit", "emptyDir": {}}


def test_values_outside_the_schema_are_refused(helm: Helm) -> None:
    for bad in ("metrics.port=abc", "nosuchvalue=1"):
        done = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", bad, check=False)
        assert done.returncode != 0 and "values don't meet the specifications of the schema" in done.stderr, bad


def test_the_chart_user_roles_are_the_ones_corral_demo_installs(helm: Helm) -> None:
    docs = render(helm)
    for name, rules in USER_ROLE_RULES.items():
        assert find(docs, "ClusterRole", f"{RELEASE}-{name}")["rules"] == rules, name


GATEWAY_RIGHT = [{"apiGroups": ["corral.dev"], "resources": ["auditcheckpoints"], "resourceNames": ["corral-gateway"],
                  "verbs": ["get", "update"]}]


def bindings_of(docs: list[dict[str, Any]], service_account: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and any(s.get("name") == service_account for s in d.get("subjects") or [])]


def test_the_gateway_has_one_right_of_its_own_and_no_other(helm: Helm) -> None:
    """get and update on its own AuditCheckpoint, by name, in the release namespace: nothing else binds it."""
    docs = render(helm)
    bound = bindings_of(docs, f"{RELEASE}-gateway")
    assert [(b["kind"], b["metadata"].get("namespace"), b["roleRef"]["kind"]) for b in bound] == [
        ("RoleBinding", SYSTEM, "Role")]
    role = find(docs, "Role", bound[0]["roleRef"]["name"])
    assert role["metadata"]["namespace"] == SYSTEM and role["rules"] == GATEWAY_RIGHT
    # More than one gateway: no pod publishes (one object cannot hold two chains), so not even that right.
    many = render(helm, "gateway.replicas=2", "audit.gatewayPersistence.enabled=false")
    assert bindings_of(many, f"{RELEASE}-gateway") == []
    assert "--audit-checkpoint" not in container_of(many, "gateway")["args"]
    assert not [d for d in many if d["kind"] == "AuditCheckpoint" and d["metadata"]["name"] == "corral-gateway"]
    assert {v["name"]: v for v in pod_of(many, "gateway")["volumes"]}["audit"] == {"name": "audit", "emptyDir": {}}


def test_more_than_one_gateway_cannot_share_one_audit_log_volume(helm: Helm) -> None:
    done = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", UNSIGNED,
                "--set", "gateway.replicas=2", check=False)
    assert done.returncode != 0 and "audit.gatewayPersistence.enabled=false" in done.stderr, done.stderr


def test_each_component_writes_its_own_audit_log_with_its_own_key(helm: Helm, tmp_path: Path) -> None:
    docs = render(helm)
    controller, gateway = container_of(docs, "controller")["args"], container_of(docs, "gateway")["args"]
    assert {f: flag(controller, f) for f in ("--audit-dir", "--audit-key", "--audit-checkpoint",
                                            "--audit-checkpoint-interval", "--serve-port", "--serve-cert",
                                            "--serve-key")} == {
        "--audit-dir": "/var/lib/corral/audit", "--audit-key": "/etc/corral/audit-keys/controller.pem",
        "--audit-checkpoint": f"{SYSTEM}/corral-controller-$(POD_NAME)", "--audit-checkpoint-interval": "300",
        "--serve-port": "8443", "--serve-cert": "/etc/corral/serving/tls.crt", "--serve-key": "/etc/corral/serving/tls.key"}
    assert {f: flag(gateway, f) for f in ("--audit-dir", "--audit-key", "--audit-checkpoint")} == {
        "--audit-dir": "/var/lib/corral/gateway-audit", "--audit-key": "/etc/corral/audit-keys/gateway.pem",
        "--audit-checkpoint": f"{SYSTEM}/corral-gateway"}
    assert "--no-create-audit-key" in controller and "--no-create-audit-key" in gateway
    # Both keys are made at run time in one Secret; the controller's init container writes its own key alone
    # into a memory volume, and the gateway mounts its own key alone from the Secret.
    init = init_of(docs)
    assert options(init, "--ed25519") == [f"{RELEASE}-audit-keys/controller.pem", f"{RELEASE}-audit-keys/gateway.pem"]
    assert [w for w in options(init, "--write") if "audit-keys" in w] == [
        f"{RELEASE}-audit-keys/controller.pem=/etc/corral/audit-keys/controller.pem"]
    # The gateway: one log volume, Recreate (one writer). The controller: one claim per ordinal from the
    # StatefulSet's template, so each replica writes its own chain and a rollout never starts a new one.
    gateway_pod = pod_of(docs, "gateway")
    assert {v["name"]: v for v in gateway_pod["volumes"]}["audit"]["persistentVolumeClaim"]["claimName"] == (
        f"{RELEASE}-gateway-audit")
    assert workload(docs, "gateway")["spec"]["strategy"] == {"type": "Recreate"}
    assert find(docs, "PersistentVolumeClaim", f"{RELEASE}-gateway-audit")["spec"]["accessModes"] == ["ReadWriteOnce"]
    controller_set = workload(docs, "controller")["spec"]
    assert "audit" not in {v["name"] for v in pod_of(docs, "controller")["volumes"]}, "the claim template's"
    (template,) = controller_set["volumeClaimTemplates"]
    assert template["metadata"]["name"] == "audit" and template["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert template["spec"]["resources"]["requests"] == {"storage": "1Gi"}
    assert controller_set["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim" and "controller" in d["metadata"]["name"]]
    for component in ("controller", "gateway"):
        mounts = {m["name"]: m for m in pod_of(docs, component)["containers"][0]["volumeMounts"]}
        assert mounts["audit-key"]["readOnly"] is True and mounts["audit"]["mountPath"].startswith("/var/lib/corral/")
    assert {v["name"]: v for v in pod_of(docs, "controller")["volumes"]}["audit-key"]["emptyDir"]["medium"] == "Memory"
    assert {v["name"]: v for v in pod_of(docs, "gateway")["volumes"]}["audit-key"]["secret"] == {
        "secretName": f"{RELEASE}-audit-keys", "defaultMode": 0o440, "items": [{"key": "gateway.pem", "path": "gateway.pem"}]}
    checkpoints = [f"corral-controller-{RELEASE}-controller-{i}" for i in (0, 1)]
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "AuditCheckpoint") == [*checkpoints,
                                                                                              "corral-gateway"]
    for name in (*checkpoints, "corral-gateway"):
        assert "spec" not in find(docs, "AuditCheckpoint", name), "Helm would reset what the component publishes"
    ports = find(docs, "Service", f"{RELEASE}-controller")["spec"]["ports"]
    assert {"name": "audit", "port": 8443, "targetPort": "audit", "protocol": "TCP"} in ports


def test_the_serving_certificate_is_for_the_service_and_loopback(helm: Helm) -> None:
    """The names the init container makes the certificate for (the certificate itself: the installed tests)."""
    docs = render(helm, "audit.serving.extraNames={audit.example.org}")
    (wanted,) = options(init_of(docs), "--server-cert")
    secret, names = wanted.split("=")
    assert secret == f"{RELEASE}-controller-serving"
    assert set(names.split(",")) == {f"{RELEASE}-controller", f"{RELEASE}-controller.{SYSTEM}",
                                     f"{RELEASE}-controller.{SYSTEM}.svc", f"{RELEASE}-controller.{SYSTEM}.svc.cluster.local",
                                     "localhost", "127.0.0.1", "::1", "audit.example.org",
                                     # each pod under the headless Service: a reader reaches one replica's chain
                                     *(f"{RELEASE}-controller-{i}.{RELEASE}-controller-pods.{SYSTEM}.svc{tail}"
                                       for i in (0, 1) for tail in ("", ".cluster.local"))}


def test_audit_volumes_keys_and_certificates_of_your_own(helm: Helm) -> None:
    docs = render(helm, "audit.existingKeySecret=my-keys", "audit.serving.existingSecret=my-tls",
                  "audit.persistence.existingClaim=my-log", "audit.gatewayPersistence.storageClass=-",
                  "audit.keepOnUninstall=false", "controller.replicas=1")  # one log volume: one writer
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] in (
        f"{RELEASE}-audit-keys", f"{RELEASE}-controller-serving")]
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("serving-ca")]
    volumes = {v["name"]: v for v in pod_of(docs, "controller")["volumes"]}
    assert volumes["audit"]["persistentVolumeClaim"]["claimName"] == "my-log"
    assert volumes["audit-key"]["secret"]["secretName"] == "my-keys"
    assert volumes["serving"]["secret"]["secretName"] == "my-tls"
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert [c["metadata"]["name"] for c in claims] == [f"{RELEASE}-gateway-audit"]
    assert claims[0]["spec"]["storageClassName"] == "" and "annotations" not in claims[0]["metadata"]
    ephemeral = render(helm, "audit.persistence.enabled=false")
    assert {v["name"]: v for v in pod_of(ephemeral, "controller")["volumes"]}["audit"]["emptyDir"] == {}
    assert [c["metadata"]["name"] for c in ephemeral if c["kind"] == "PersistentVolumeClaim"] == [
        f"{RELEASE}-gateway-audit"]
    kept = render(helm)
    assert options(init_of(kept), "--keep") == [f"{RELEASE}-audit-keys"], "no owner: it outlives an uninstall"
    claim = find(kept, "PersistentVolumeClaim", f"{RELEASE}-gateway-audit")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # The controller's claims are its StatefulSet's: kept on uninstall by their retention policy, not by Helm.
    assert workload(kept, "controller")["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    dropped = render(helm, "audit.keepOnUninstall=false")
    assert "--keep" not in init_of(dropped)
    assert workload(dropped, "controller")["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete", "whenScaled": "Retain"}


# The README's edge install on k3s, and every optional component on at once.
K3S = ("mosquitto.enabled=true", "mosquitto.service.type=LoadBalancer", "signing.require=true",
       "signing.keysSecret=corral-signing-keys", "nodeAddress=192.168.1.10")
EVERYTHING = (*K3S, "mosquitto.plainListener=true", "metrics.enabled=true", "metrics.serviceMonitor.enabled=true",
              "networkPolicy.enabled=true", "networkPolicy.egress.restrict=true", "console.enabled=true",
              "gateway.deviceTools=true", "notifications.webhooks[0].name=phone", "notifications.webhooks[0].kind=ntfy",
              "notifications.webhooks[0].secretName=ntfy")
PEM_BLOCK = re.compile(r"-----BEGIN [A-Z ]*(PRIVATE KEY|CERTIFICATE)-----")


def secret_env(docs: list[dict[str, Any]]) -> list[str]:
    """Every environment variable a Secret fills, in any container of any workload."""
    found = []
    for doc in docs:
        pod = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            found += [f"{container['name']}: {e['name']}" for e in container.get("env") or []
                      if "secretKeyRef" in (e.get("valueFrom") or {})]
            found += [f"{container['name']}: envFrom {e['secretRef']}" for e in container.get("envFrom") or []
                      if "secretRef" in e]
    return found


@pytest.mark.parametrize("sets", [(), K3S, EVERYTHING], ids=["defaults", "k3s", "everything"])
def test_a_rendered_chart_holds_no_key_certificate_or_password(helm: Helm, sets: tuple[str, ...]) -> None:
    """What a template generates lands in every release record and changes with every render: nothing secret is
    generated (no PEM block, no Secret at all), two renders are byte for byte the same, and no container gets a
    secret through its environment."""
    args = ["template", RELEASE, str(CHART), "-n", SYSTEM, "--kube-version", KUBE_VERSION, "--set", UNSIGNED]
    for value in sets:
        args += ["--set", value]
    first, second = helm(*args).stdout, helm(*args).stdout
    assert first == second, "a second render differs: something is generated at render time"
    assert not PEM_BLOCK.search(first)
    docs = [d for d in yaml.safe_load_all(first) if d]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"] == []
    assert secret_env(docs) == []
    # Positive control: what the render leaves out is made at run time, by the controller's init container.
    made = options(init_of(docs), "--server-cert") + options(init_of(docs), "--ed25519") + options(init_of(docs), "--password")
    assert any(m.startswith(f"{RELEASE}-audit-keys/") for m in made)
    if "mosquitto.enabled=true" in sets:
        assert f"{RELEASE}-broker-accounts/controller-password" in made
        assert any(m.startswith(f"{RELEASE}-mosquitto-tls=") for m in made)
        mosquitto = pod_of(docs, "mosquitto")
        assert flag(mosquitto["initContainers"][0]["args"], "--password-file") == "/etc/corral/broker/controller-password"


def test_secrets_of_your_own_are_referenced_and_nothing_is_made(helm: Helm) -> None:
    """With existingSecret values the chart mounts those Secrets and makes none: no init container, no right to
    create Secrets. Positive control: the URL keeps the username, the password is a file from your Secret."""
    docs = render(helm, "audit.existingKeySecret=my-keys", "audit.serving.existingSecret=my-tls",
                  "mqtt.url=mqtts://broker.lan:8883", "mqtt.username=corral", "mqtt.existingSecret=my-broker",
                  "mqtt.caSecret=my-ca")
    pod = pod_of(docs, "controller")
    assert "initContainers" not in pod
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}
    assert (volumes["audit-key"], volumes["serving"], volumes["mqtt-password"], volumes["mqtt-ca"]) == (
        "my-keys", "my-tls", "my-broker", "my-ca")
    assert {v["name"]: v for v in pod_of(docs, "gateway")["volumes"]}["audit-key"]["secret"]["secretName"] == "my-keys"
    args = container_of(docs, "controller")["args"]
    assert (flag(args, "--mqtt"), flag(args, "--mqtt-password-file")) == ("mqtts://corral@broker.lan:8883",
                                                                         "/etc/corral/mqtt/password")
    assert not [d for d in docs if d["kind"] in ("Secret", "Role") and d["metadata"]["name"].endswith("own-secrets")]
    assert not [d for d in docs if d["kind"] == "Secret"]
    # The bundled broker with a certificate of your own: only the controller's password is still made here.
    bundled = render(helm, "audit.existingKeySecret=my-keys", "audit.serving.existingSecret=my-tls",
                     "mosquitto.enabled=true", "mosquitto.tls.secretName=my-broker-tls")
    assert options(init_of(bundled), "--password") == [f"{RELEASE}-broker-accounts/controller-password"]
    assert options(init_of(bundled), "--server-cert") == []
    assert {v["name"]: v for v in pod_of(bundled, "mosquitto")["volumes"]}["certs"]["secret"]["secretName"] == "my-broker-tls"
    assert {v["name"]: v for v in pod_of(bundled, "controller")["volumes"]}["mqtt-ca"]["secret"]["secretName"] == "my-broker-tls"


@pytest.mark.parametrize(("sets", "refusal"), [
    (("mqtt.url=mqtt://corral:hunter2@broker:1883",), "mqtt.url carries a password"),
    (("mosquitto.enabled=true", "mqtt.existingSecret=mine"), "for a broker of your own"),
    (("mqtt.existingSecret=mine",), "need the account's username"),
])
def test_a_password_in_the_controller_arguments_is_refused(helm: Helm, sets: tuple[str, ...], refusal: str) -> None:
    assert_refused(helm, sets, refusal)


def test_the_audit_log_is_read_with_the_audit_verb(helm: Helm) -> None:
    docs = render(helm, "networkPolicy.enabled=true")
    assert find(docs, "ClusterRole", f"{RELEASE}-audit-reader")["rules"] == [
        {"apiGroups": ["corral.dev"], "resources": ["devices"], "verbs": ["audit"]}]
    ingress = find(docs, "NetworkPolicy", f"{RELEASE}-controller")["spec"]["ingress"]
    assert {"ports": [{"port": 8443, "protocol": "TCP"}]} in ingress
    cluster = find(docs, "ClusterRole", f"{RELEASE}-controller")["rules"]
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]} in cluster
    assert find(docs, "Role", f"{RELEASE}-controller-audit-checkpoint")["rules"] == [
        {"apiGroups": ["corral.dev"], "resources": ["auditcheckpoints"],
         "resourceNames": [f"corral-controller-{RELEASE}-controller-0", f"corral-controller-{RELEASE}-controller-1"],
         "verbs": ["get", "update"]},
        {"apiGroups": ["corral.dev"], "resources": ["auditcheckpoints"], "verbs": ["create"]}]


def test_the_readme_lists_every_right_of_the_controller(helm: Helm) -> None:
    docs = render(helm, "signing.keysSecret=signing-keys")
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role") and d["metadata"]["name"].startswith(
        f"{RELEASE}-controller")]
    granted: dict[tuple[str, str, bool], set[str]] = {}
    for rule in (rule for role in roles for rule in role["rules"]):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group or '""', resource, "resourceNames" in rule), set()).update(rule["verbs"])
    assert controller_rights() == granted


def test_the_approval_page_is_reached_only_on_its_port_and_reaches_only_the_api_server(helm: Helm) -> None:
    ingress_pods = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "ingress-nginx"}}}
    docs = render(helm, "console.enabled=true", "networkPolicy.enabled=true", "networkPolicy.egress.restrict=true",
                  "networkPolicy.consoleFrom[0].podSelector.matchLabels.app\\.kubernetes\\.io/name=ingress-nginx")
    policy = find(docs, "NetworkPolicy", f"{RELEASE}-console")["spec"]
    pod_labels = find(docs, "Deployment", f"{RELEASE}-console")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}], "from": [ingress_pods]}]
    egress_ports = {p["port"] for rule in policy["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 443, 6443}, "DNS and the API server; never the broker"
    assert not [d for d in render(helm, "networkPolicy.enabled=true")
                if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == f"{RELEASE}-console"]


def test_the_bundled_broker_admits_only_its_accounts_over_tls(installed: Installed, tmp_path: Path) -> None:
    """The bundled Mosquitto exactly as rendered: the controller pod's init container makes its certificate and
    the controller's password at run time (into Secrets of the installed plane), its own init container writes
    the dynamic security state from the password file (`corral broker init-dynsec --password-file`), and the
    local mosquitto runs its mosquitto.conf: an anonymous client is refused, each controller pod's own account
    (its pod name, one per ordinal: the client id is the username) is admitted over verified TLS and may run the
    dynamic security plugin, and no account is shared by the replicas."""
    docs = render(installed.helm, "mosquitto.enabled=true", "mosquitto.tls.extraNames={127.0.0.1}")
    config = find(docs, "ConfigMap", f"{RELEASE}-mosquitto")["data"]["mosquitto.conf"]
    assert "allow_anonymous false" in config and "use_username_as_clientid true" in config
    assert "listener 1883" not in config, "plain MQTT is opt-in (mosquitto.plainListener)"
    assert "max_packet_size 262144" in config
    pod_files = tmp_path / "controller-pod"
    run_init_container(init_of(docs), pod_files, installed.plane.kubeconfig)
    # Rendered for two replicas, that start made the serving certificate for both pods' names: the installed
    # release's own start puts back its certificate (one replica), as the tests after this one expect to find it.
    run_init_container(init_of(installed.manifest), installed.pod_files, installed.controller_kubeconfig)
    core = kubernetes.client.CoreV1Api(installed.admin)

    def secret(name: str) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in core.read_namespaced_secret(name, SYSTEM).data.items()}

    tls, ca = secret(f"{RELEASE}-mosquitto-tls"), secret(f"{RELEASE}-mosquitto-ca")
    assert ca == {"ca.crt": tls["ca.crt"]} and b"PRIVATE" not in ca["ca.crt"]
    password = secret(f"{RELEASE}-broker-accounts")["controller-password"].decode()
    # The controller's files: its password and the broker's CA, as the init container wrote them.
    args = container_of(docs, "controller")["args"]
    assert flag(args, "--mqtt") == f"mqtts://$(POD_NAME)@{RELEASE}-mosquitto:8883"
    pods = [f"{RELEASE}-controller-0", f"{RELEASE}-controller-1"]
    assert (pod_files / flag(args, "--mqtt-password-file").lstrip("/")).read_text() == password
    assert (pod_files / flag(args, "--mqtt-ca").lstrip("/")).read_bytes() == tls["ca.crt"]

    root = tmp_path / "mosquitto"
    for part in ("config", "data", "certs", "broker"):
        (root / part).mkdir(parents=True)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (root / "certs" / name).write_bytes(tls[name])
    (secret_file := root / "broker" / "controller-password").write_text(password)
    secret_file.chmod(0o600)
    port = free_port()
    local = (config.replace("/mosquitto/", f"{root}/").replace("listener 8883", f"listener {port} 127.0.0.1")
             .replace(find_plugin_line(config), f"plugin {broker.plugin_path()}"))
    local += f"\n# Run as root, Mosquitto would switch to a user that cannot read the test's files.\nuser {getpass.getuser()}\n"
    (root / "config" / "mosquitto.conf").write_text(local)
    init_dynsec = pod_of(docs, "mosquitto")["initContainers"][0]["args"]
    assert options(init_dynsec, "--controller-username") == pods
    subprocess.run([CORRAL, *[a.replace("/mosquitto/", f"{root}/").replace("/etc/corral/", f"{root}/")
                              for a in init_dynsec]], env={k: v for k, v in os.environ.items() if "MQTT" not in k},
                   check=True, capture_output=True)
    log = root / "mosquitto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([find_mosquitto(), "-c", str(root / "config" / "mosquitto.conf")],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is None and accepts_connections(port),
                 f"the rendered broker to listen (log {log})", timeout_s=10)
        context = ssl.create_default_context(cafile=str(root / "certs" / "ca.crt"))
        assert _connack(port, context, None, None) in ("Not authorized", "Bad user name or password")
        refused = ("Not authorized", "Bad user name or password")
        assert _connack(port, context, pods[0], "wrong") in refused
        assert _connack(port, context, files.BROKER_CONTROLLER, password) in refused, "no account shared by all"
        for pod in pods:
            assert _connack(port, context, pod, password) == "Success", pod
        answers = dynsec_at(port, (pods[1], password), [{"command": "listClients"}], tls=context)
        assert sorted(answers[0]["data"]["clients"]) == pods
        # max_packet_size: a contract-sized packet passes, a 300 KiB one is cut off at the broker.
        assert _acknowledged(port, context, pods[0], password, 64 * 1024)
        assert not _acknowledged(port, context, pods[0], password, 300 * 1024)
    finally:
        proc.kill()
        proc.wait(5)


def _acknowledged(port: int, context: ssl.SSLContext, username: str, password: str, size: int) -> bool:
    """Whether the broker acknowledges a QoS 1 publish of `size` bytes from the controller (on a command topic
    it may use). MQTT 3.1.1, so that the client does not hold back what the broker announced it refuses."""
    answered, dropped = threading.Event(), threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311, client_id=username)
    c.tls_set_context(context)
    c.username_pw_set(username, password)
    c.on_publish = lambda *_: answered.set()
    c.on_disconnect = lambda *_: dropped.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        c.publish("chart/probe/cmd", b"x" * size, qos=1)
        wait_for(lambda: answered.is_set() or dropped.is_set(), "the broker to answer or drop the publish")
        return answered.is_set() and not dropped.is_set()
    finally:
        c.disconnect()
        c.loop_stop()


def find_plugin_line(config: str) -> str:
    return next(line for line in config.splitlines() if line.startswith("plugin "))


def _connack(port: int, context: ssl.SSLContext, username: str | None, password: str | None) -> str:
    """The broker's CONNACK reason for an MQTT 5 client over verified TLS to 127.0.0.1."""
    with client(port, Account(username, password), tls=context) as c:
        return str(c.connect())


@dataclass
class Installed:
    plane: Plane
    admin: kubernetes.client.ApiClient
    helm: Helm
    controller_kubeconfig: Path
    controller_args: list[str]
    manifest: list[dict[str, Any]]
    pod_files: Path  # where the controller pod's init container wrote its files (its memory volumes)
    signed: dict[str, dict[str, Any]]  # the catalog's contracts signed with the key the Secret trusts (type ->)


def run_init_container(args: list[str], root: Path, kubeconfig: Path) -> None:
    """`corral secrets ensure` with a rendered init container's arguments (in this process: a Python start less),
    its files written under `root`."""
    local = [arg.replace("=/etc/corral/", f"={root}/etc/corral/") for arg in args]
    done = CliRunner().invoke(cli, [*local[:2], "--kubeconfig", str(kubeconfig), *local[2:]])
    assert done.exit_code == 0, done.output


@pytest.fixture(scope="module")
def installed(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The chart installed by `helm install` into a plane of its own (so the chart owns every Corral object)."""
    state = tmp_path_factory.mktemp("chart-plane")
    dev = DevPlane(state, progress=lambda line: None)
    plane = dev.up()
    try:
        admin = api_client(plane)
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": HOME}})
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": SYSTEM}})
        # The chart's default requires signed contracts: its README's steps, a key trusted in a Secret and the
        # catalog's contracts signed with it (the fleet below runs that signed build).
        key = state / "vendor.pem"
        made = CliRunner().invoke(cli, ["contracts", "keygen", "--key", str(key), "--secret",
                                        f"{SYSTEM}/corral-signing-keys", "--kubeconfig", str(plane.kubeconfig)])
        assert made.exit_code == 0, made.output
        signed = CliRunner().invoke(cli, ["contracts", "sign", "--key", str(key), "--out", str(state / "signed.json")])
        assert signed.exit_code == 0, signed.output
        helm_on_plane = Helm(helm.binary, plane.kubeconfig)
        helm_on_plane("install", RELEASE, str(CHART), "-n", SYSTEM, "--set", "signing.keysSecret=corral-signing-keys",
                      "--set", f"controller.watchNamespaces={{{HOME}}}",
                      "--set", f"controller.deviceNamespace={HOME}", "--set", "policy.intentRetentionSeconds=3",
                      "--set", "mqtt.topicPrefix=chart",
                      # One replica: the controller runs here as a process with a token bound to no Pod, which the
                      # API server's fencing (rendered for several replicas) refuses; it still leads through its Lease.
                      "--set", "controller.replicas=1")
        manifest = [d for d in yaml.safe_load_all(helm_on_plane("get", "manifest", RELEASE, "-n", SYSTEM).stdout) if d]
        container = container_of(manifest, "controller")
        token = service_account_token(admin, SYSTEM, f"{RELEASE}-controller")
        kubeconfig = kubeconfig_for(plane, token, state / "controller.kubeconfig", SYSTEM)
        # The controller pod's first step, as its ServiceAccount: make the keys, certificates and passwords.
        wait_until_allowed(api_client(plane, token=token), "create", SYSTEM, "secrets", group="")
        run_init_container(init_of(manifest), state / "pod", kubeconfig)
        yield Installed(plane, admin, helm_on_plane, kubeconfig, list(container["args"]), manifest, state / "pod",
                        json.loads((state / "signed.json").read_text()))
    finally:
        dev.down(purge=True)


def test_helm_install_creates_the_release_with_crds_and_policies(installed: Installed) -> None:
    status = installed.helm.status(RELEASE, SYSTEM)
    assert status["info"]["status"] == "deployed"
    ext = kubernetes.client.ApiextensionsV1Api(installed.admin)
    assert {c.metadata.name for c in ext.list_custom_resource_definition().items} >= {
        "devices.corral.dev", "intents.corral.dev", "approvals.corral.dev", "capabilities.corral.dev",
        "auditcheckpoints.corral.dev"}
    checkpoints = kubernetes.client.CustomObjectsApi(installed.admin).list_namespaced_custom_object(
        GROUP, VERSION, SYSTEM, "auditcheckpoints")["items"]
    assert {c["metadata"]["name"] for c in checkpoints} == {CONTROLLER_CHECKPOINT, "corral-gateway"}
    # The controller's claims are the StatefulSet's (made with its pods, which this plane does not run).
    claims = kubernetes.client.CoreV1Api(installed.admin).list_namespaced_persistent_volume_claim(SYSTEM).items
    assert {c.metadata.name for c in claims} == {f"{RELEASE}-gateway-audit"}
    policies = kubernetes.client.AdmissionregistrationV1Api(installed.admin).list_validating_admission_policy()
    assert policies.items, "the admission policies are part of the release"


def test_the_init_container_makes_the_secrets_with_only_the_chart_rbac(installed: Installed) -> None:
    """The installed fixture ran the rendered init container as the controller's ServiceAccount: the audit keys
    (kept: no owner), the serving CA and certificate (owned by the ServiceAccount, so gone with the release),
    the CA published for readers and in the readings APIService. A second start keeps all of it unwritten."""
    core = kubernetes.client.CoreV1Api(installed.admin)
    account = core.read_namespaced_service_account(f"{RELEASE}-controller", SYSTEM)
    keys = core.read_namespaced_secret(f"{RELEASE}-audit-keys", SYSTEM)
    serving = core.read_namespaced_secret(f"{RELEASE}-controller-serving", SYSTEM)
    assert keys.metadata.owner_references is None, "kept: the log needs its key after an uninstall"
    assert [(o.kind, o.name, o.uid) for o in serving.metadata.owner_references] == [
        ("ServiceAccount", f"{RELEASE}-controller", account.metadata.uid)]
    pems = {k: base64.b64decode(v) for k, v in keys.data.items()}
    assert set(pems) == {"controller.pem", "gateway.pem"} and pems["controller.pem"] != pems["gateway.pem"]
    for pem in pems.values():
        assert isinstance(serialization.load_pem_private_key(pem, password=None), Ed25519PrivateKey)
    assert serving.type == "kubernetes.io/tls"
    tls = {k: base64.b64decode(v) for k, v in serving.data.items()}
    ca = core.read_namespaced_config_map(f"{RELEASE}-controller-serving-ca", SYSTEM).data["ca.crt"].encode()
    assert ca == tls["ca.crt"] and b"PRIVATE" not in ca
    cert = x509.load_pem_x509_certificate(tls["tls.crt"])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    assert certificate_names(tls["tls.crt"]) >= {f"{RELEASE}-controller.{SYSTEM}.svc", "localhost", "127.0.0.1", "::1"}
    service = kubernetes.client.ApiregistrationV1Api(installed.admin).read_api_service("v1alpha1.readings.corral.dev")
    assert base64.b64decode(service.spec.ca_bundle) == ca
    # The pod's own files: its key and certificate, nothing of the gateway's.
    assert mounted_files(installed, "controller")["/etc/corral/audit-keys/controller.pem"] == pems["controller.pem"]
    assert (installed.pod_files / "etc/corral/audit-keys/controller.pem").stat().st_mode & 0o777 == 0o600
    # Again, as at every start: nothing is written.
    versions = [keys.metadata.resource_version, serving.metadata.resource_version]
    run_init_container(init_of(installed.manifest), installed.pod_files, installed.controller_kubeconfig)
    assert [core.read_namespaced_secret(n, SYSTEM).metadata.resource_version
            for n in (f"{RELEASE}-audit-keys", f"{RELEASE}-controller-serving")] == versions
    # Least privilege: by name, its own Secrets only.
    controller = kubernetes.client.AuthorizationV1Api(kubeconfig_client(installed.controller_kubeconfig))
    for name, allowed in ((f"{RELEASE}-audit-keys", True), (f"{RELEASE}-controller-serving", True), ("someone-else", False)):
        review = controller.create_self_subject_access_review({"spec": {"resourceAttributes": {
            "verb": "get", "resource": "secrets", "namespace": SYSTEM, "name": name}}})
        assert review.status.allowed is allowed, name


def test_the_helm_release_record_holds_none_of_the_keys(installed: Installed) -> None:
    """The finding: keys generated by templates were in every release record (a Secret anyone who reads Secrets
    in the namespace can decode). Now the record holds no PEM block and none of the keys the install uses,
    which exist all the same (made at run time)."""
    core = kubernetes.client.CoreV1Api(installed.admin)
    records = core.list_namespaced_secret(SYSTEM, label_selector="owner=helm").items
    assert records, "Helm keeps its release record in a Secret"
    used = [base64.b64decode(v) for v in core.read_namespaced_secret(f"{RELEASE}-audit-keys", SYSTEM).data.values()]
    used += [base64.b64decode(core.read_namespaced_secret(f"{RELEASE}-controller-serving", SYSTEM).data["tls.key"])]
    for record in records:
        release = gzip.decompress(base64.b64decode(base64.b64decode(record.data["release"]))).decode()
        assert f"{RELEASE}-controller" in release  # it is the manifest
        assert not PEM_BLOCK.search(release)
        # Neither as text nor as a Secret's base64 data.
        assert not [key for key in used if key.decode().split("\n")[1] in release
                    or base64.b64encode(key).decode() in release]


def test_concurrent_starts_converge_on_one_secret(installed: Installed) -> None:
    """Several starts at once against the real API server: one creates, the others get 409 and use what it made,
    so every one of them hands out the same key, password and CA."""
    wanted = [Wanted("race-keys", ed25519=["a.pem"], passwords=["password"]),
              Wanted("race-tls", server_names=["race.example", "127.0.0.1"])]

    def start(_: int) -> list[dict[str, bytes]]:
        client = api_client(installed.plane)
        return [ensure_secret(client, HOME, w, None) for w in wanted]

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(start, range(6)))
    assert all(r == results[0] for r in results), "every start must see the same Secrets"
    core = kubernetes.client.CoreV1Api(installed.admin)
    stored = {k: base64.b64decode(v) for k, v in core.read_namespaced_secret("race-tls", HOME).data.items()}
    assert stored == results[0][1]
    # New names: a new certificate from the same CA (whoever trusts it keeps trusting); the keys stay.
    more = Wanted("race-tls", server_names=["race.example", "127.0.0.1", "race.lan"])
    changed = ensure_secret(api_client(installed.plane), HOME, more, None)
    assert changed["ca.crt"] == stored["ca.crt"] and changed["tls.crt"] != stored["tls.crt"]
    assert certificate_names(changed["tls.crt"]) == {"race.example", "127.0.0.1", "race.lan"}
    assert ensure_secret(api_client(installed.plane), HOME, wanted[0], None) == results[0][0]


def mounted_files(installed: Installed, component: str) -> dict[str, bytes]:
    """What the pod would find in its Secret volumes (from the installed Secrets) and in the memory volumes its
    init container filled (from the files it wrote): mount path -> content."""
    pod = pod_of(installed.manifest, component)
    volumes = {v["name"]: v for v in pod["volumes"]}
    core = kubernetes.client.CoreV1Api(installed.admin)
    files: dict[str, bytes] = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        if mount["name"] not in volumes:  # a claim template's volume (the StatefulSet's audit log)
            continue
        secret = volumes[mount["name"]].get("secret")
        if (volumes[mount["name"]].get("emptyDir") or {}).get("medium") == "Memory":
            written = installed.pod_files / mount["mountPath"].lstrip("/")
            files |= {f"{mount['mountPath']}/{f.name}": f.read_bytes() for f in written.iterdir()
                      if not f.name.startswith(".")}
        if secret is None:
            continue
        data = core.read_namespaced_secret(secret["secretName"], SYSTEM).data
        for item in secret["items"]:
            files[f"{mount['mountPath']}/{item['path']}"] = base64.b64decode(data[item["key"]])
    return files


def test_the_controller_runs_end_to_end_with_only_the_chart_rbac(installed: Installed, tmp_path: Path) -> None:
    plane, admin = installed.plane, installed.admin
    args = list(installed.controller_args)
    args[args.index("--health-port") + 1] = str(health := free_port())
    args[args.index("--serve-port") + 1] = str(serve := free_port())
    args[args.index("--audit-checkpoint-interval") + 1] = "1"  # the chart's 300 s would outlast the test
    args[args.index("--mqtt") + 1] = f"mqtt://{files.BROKER_CONTROLLER}@127.0.0.1:{plane.mqtt_port}"  # the plane's
    mounted = mounted_files(installed, "controller")
    args = localized(args, tmp_path, mounted)
    env = {**os.environ, "KUBECONFIG": str(installed.controller_kubeconfig), "POD_NAME": POD, "POD_NAMESPACE": SYSTEM,
           "CORRAL_MQTT_URL": f"mqtt://{files.BROKER_CONTROLLER}@127.0.0.1:{plane.mqtt_port}",
           "CORRAL_MQTT_PASSWORD_FILE": str(plane.password_file(files.BROKER_CONTROLLER))}
    agent_token = _user(installed, "agent", "agent-operator")
    approver_token = _user(installed, "approver", "approver", person=True)
    agent = api_client(plane, token=agent_token)
    log = tmp_path / "controller.log"
    # The chart's default: signed contracts only, from the Secret the README's `corral contracts keygen` made.
    assert "--require-signatures" in args and flag(args, "--signing-keys") == f"{SYSTEM}/corral-signing-keys"
    devices = {"porch-light": "light", "back-lock": "lock"}
    with running_fleet(plane, "chart", devices, enroll_in=(admin, HOME),
                       contracts={d: installed.signed[t] for d, t in devices.items()}) as fleet, \
            open(log, "ab") as out:
        controller = subprocess.Popen([CORRAL, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: healthz(health), f"the controller to start (log {log})", timeout_s=30)
            objects = kubernetes.client.CustomObjectsApi(admin)
            wait_for(lambda: all((objects.get_namespaced_custom_object("corral.dev", "v1alpha1", HOME, "devices", d)
                                  .get("status") or {}).get("inSync") for d in ("porch-light", "back-lock")),
                     f"the enrolled devices to sync (log {log})", timeout_s=30)
            requester = f"system:serviceaccount:{HOME}:agent"
            low = {"device": "porch-light", "actuator": "power", "action": "set_state", "params": {"value": True},
                   "reason": "chart test", "requester": requester}
            assert submit(agent, HOME, "porch-on", low).code == "CREATED"
            done = wait_settled(agent, HOME, "porch-on", timeout_s=20)
            assert (done["status"]["code"], done["status"]["after"]["power"]) == ("EXECUTED", True), done["status"]
            high = {**low, "device": "back-lock", "actuator": "locked", "params": {"value": True}}
            submit(agent, HOME, "lock-up", high)
            assert wait_settled(agent, HOME, "lock-up", timeout_s=20)["status"]["phase"] == "AwaitingApproval"
            decide_on(api_client(plane, token=approver_token), HOME, "lock-up", "Approve", "chart test")
            locked = wait_for(lambda: (i := wait_settled(agent, HOME, "lock-up", 5))["status"].get("code") and i,
                              "the approved Intent to finish", timeout_s=20)
            assert locked["status"]["code"] == "EXECUTED"
            assert hardware_applies(fleet, "back-lock").count(("locked", True)) == 1
            wait_for(lambda: any(e.reason == "Executed" and e.related and e.related.name == "back-lock"
                                 for e in kubernetes.client.EventsV1Api(admin).list_namespaced_event(HOME).items),
                     "the controller to post the Intent's outcome Event, related to its Device")
            wait_for(lambda: _gone(objects, "porch-on"), "the finished Intent to be deleted after its TTL",
                     timeout_s=30)
            _read_and_verify_the_audit_log(installed, f"https://127.0.0.1:{serve}",
                                           mounted["/etc/corral/audit-keys/controller.pem"], tmp_path)
        finally:
            controller.terminate()
            controller.wait(20)
    assert not _refusals(log.read_text()), log.read_text()[-3000:]


def _refusals(log: str) -> list[str]:
    """The log lines where the API server refused the chart's RBAC (a 403 status, not a port number that holds
    the digits 403)."""
    return [line for line in log.splitlines() if re.search(r"(?<![\d:])403\b|Forbidden", line)]


def _read_and_verify_the_audit_log(installed: Installed, server: str, private_key: bytes, tmp_path: Path) -> None:
    """As the README says: a person bound to <fullname>-audit-reader reads the log through the controller's
    HTTPS server (its CA from the chart's ConfigMap), and verifies it with the public key derived from the
    chart's Secret, against the AuditCheckpoint the controller published with the chart's RBAC."""
    ca = tmp_path / "ca.crt"
    ca.write_text(kubernetes.client.CoreV1Api(installed.admin).read_namespaced_config_map(
        f"{RELEASE}-controller-serving-ca", SYSTEM).data["ca.crt"])
    service_account_token(installed.admin, SYSTEM, "auditor")
    kubernetes.client.RbacAuthorizationV1Api(installed.admin).create_cluster_role_binding({
        "metadata": {"name": "chart-auditor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{RELEASE}-audit-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "auditor", "namespace": SYSTEM}]})
    auditor = service_account_token(installed.admin, SYSTEM, "auditor")
    wait_until_allowed(api_client(installed.plane, token=auditor), "audit", "", "devices")
    shown = CliRunner().invoke(cli, ["audit", "show", "--server", server, "--ca-file", str(ca), "--token", auditor,
                                     "--intent", "lock-up", "-o", "json"])
    assert shown.exit_code == 0, shown.output
    assert [json.loads(line)["kind"] for line in shown.output.splitlines()][-1] == "intent.decided"
    stranger = service_account_token(installed.admin, SYSTEM, "stranger")
    request = urllib.request.Request(server + "/audit/v1/records", headers={"Authorization": f"Bearer {stranger}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(ca)), timeout=10)
    assert refused.value.code == 403
    public = CliRunner().invoke(cli, ["audit", "public-key", "-"], input=private_key)
    assert public.exit_code == 0 and "PUBLIC KEY" in public.output, public.output
    (key := tmp_path / "controller.pub.pem").write_text(public.output)
    wait_for(lambda: _checkpoint(installed.admin, CONTROLLER_CHECKPOINT).get("seq"),
             "the controller to publish a checkpoint", timeout_s=15)
    verified = CliRunner().invoke(cli, ["audit", "verify", "--server", server, "--ca-file", str(ca), "--token", auditor,
                                        "--key", str(key), "--checkpoint-object", f"{SYSTEM}/{CONTROLLER_CHECKPOINT}"],
                                  env={"KUBECONFIG": str(installed.plane.kubeconfig)})
    assert verified.exit_code == 0 and "covers seq" in verified.output, verified.output


def _checkpoint(admin: kubernetes.client.ApiClient, name: str) -> dict[str, Any]:
    body = kubernetes.client.CustomObjectsApi(admin).get_namespaced_custom_object(
        GROUP, VERSION, SYSTEM, "auditcheckpoints", name)
    spec: dict[str, Any] = body.get("spec") or {}
    return spec


def test_a_second_signing_key_is_trusted_beside_the_first_and_never_replaces_it(installed: Installed,
                                                                                 tmp_path: Path) -> None:
    """Rotation as the README says it: a new key under another entry; the same entry with another key is refused
    (replacing a trusted key would refuse every device signed with the old one), and the Secret is left as it was."""
    core = kubernetes.client.CoreV1Api(installed.admin)
    before = core.read_namespaced_secret("corral-signing-keys", SYSTEM).data

    def keygen(key: str, *more: str) -> Any:
        return CliRunner().invoke(cli, ["contracts", "keygen", "--key", str(tmp_path / key), "--secret",
                                        f"{SYSTEM}/corral-signing-keys", "--kubeconfig",
                                        str(installed.plane.kubeconfig), *more])

    clash = keygen("again.pem")
    assert clash.exit_code == 1 and "already trusts another key as 'vendor': choose another entry" in clash.stderr
    assert core.read_namespaced_secret("corral-signing-keys", SYSTEM).data == before
    added = keygen("next.pem", "--entry", "vendor-2027")
    assert added.exit_code == 0, added.output
    after = core.read_namespaced_secret("corral-signing-keys", SYSTEM).data
    assert after == {**before, "vendor-2027": base64.b64encode(added.stdout.encode()).decode()}


@pytest.mark.parametrize(("verb", "group", "resource", "namespace"), [
    ("get", "", "secrets", SYSTEM), ("list", "", "secrets", "default"), ("create", "", "secrets", HOME),
    ("delete", "corral.dev", "devices", HOME), ("create", "corral.dev", "devices", HOME),
    ("update", "corral.dev", "devices", HOME), ("create", "corral.dev", "intents", HOME),
    ("create", "corral.dev", "approvals", HOME), ("update", "corral.dev", "capabilities", None),
    ("create", "", "pods", HOME), ("list", "", "configmaps", HOME), ("create", "rbac.authorization.k8s.io", "rolebindings", HOME),
    ("impersonate", "", "users", None), ("list", "corral.dev", "auditcheckpoints", SYSTEM),
    ("create", "corral.dev", "auditcheckpoints", HOME), ("delete", "corral.dev", "auditcheckpoints", SYSTEM),
])
def test_the_controller_service_account_can_do_nothing_else(
        installed: Installed, verb: str, group: str, resource: str, namespace: str | None) -> None:
    controller = kubeconfig_client(installed.controller_kubeconfig)
    review = kubernetes.client.AuthorizationV1Api(controller).create_self_subject_access_review({"spec": {
        "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace}}})
    assert review.status.allowed is False, f"the controller may {verb} {resource} in {namespace}"


@pytest.mark.parametrize(("verb", "name", "allowed"), [
    ("get", CONTROLLER_CHECKPOINT, True), ("update", CONTROLLER_CHECKPOINT, True), ("create", None, True),
    ("update", "corral-gateway", False), ("patch", CONTROLLER_CHECKPOINT, False), ("delete", CONTROLLER_CHECKPOINT, False),
    ("update", "corral-controller", False), ("update", f"corral-controller-{RELEASE}-controller-1", False),
])
def test_the_controller_may_publish_its_own_checkpoint_only(installed: Installed, verb: str, name: str | None,
                                                            allowed: bool) -> None:
    controller = kubeconfig_client(installed.controller_kubeconfig)
    attributes = {"verb": verb, "group": "corral.dev", "resource": "auditcheckpoints", "namespace": SYSTEM}
    review = kubernetes.client.AuthorizationV1Api(controller).create_self_subject_access_review({"spec": {
        "resourceAttributes": {**attributes, **({"name": name} if name else {})}}})
    assert review.status.allowed is allowed, (verb, name)


def test_the_gateway_service_account_has_its_one_right_and_no_other(installed: Installed, tmp_path: Path) -> None:
    token = service_account_token(installed.admin, SYSTEM, f"{RELEASE}-gateway")
    gateway = kubeconfig_client(kubeconfig_for(installed.plane, token, tmp_path / "gw.kubeconfig", SYSTEM))
    checks = [("list", "devices", HOME, None), ("create", "intents", HOME, None), ("get", "capabilities", None, None),
              ("get", "auditcheckpoints", SYSTEM, "corral-gateway"), ("update", "auditcheckpoints", SYSTEM, "corral-gateway"),
              ("patch", "auditcheckpoints", SYSTEM, "corral-gateway"), ("delete", "auditcheckpoints", SYSTEM, "corral-gateway"),
              ("update", "auditcheckpoints", SYSTEM, CONTROLLER_CHECKPOINT), ("get", "auditcheckpoints", SYSTEM, CONTROLLER_CHECKPOINT),
              ("create", "auditcheckpoints", SYSTEM, None), ("list", "auditcheckpoints", SYSTEM, None),
              ("watch", "auditcheckpoints", SYSTEM, None), ("audit", "devices", None, None)]
    for verb, resource, namespace, name in checks:
        attributes = {"verb": verb, "group": "corral.dev", "resource": resource, "namespace": namespace, "name": name}
        review = kubernetes.client.AuthorizationV1Api(gateway).create_self_subject_access_review({"spec": {
            "resourceAttributes": attributes}})
        expected = (resource, verb) == ("capabilities", "get") or (name == "corral-gateway" and verb in ("get", "update"))
        assert review.status.allowed is expected, (verb, resource, name)
    # And for real: the controller's checkpoint is out of its reach.
    objects = kubernetes.client.CustomObjectsApi(gateway)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        objects.get_namespaced_custom_object(GROUP, VERSION, SYSTEM, "auditcheckpoints", CONTROLLER_CHECKPOINT)
    assert refused.value.status == 403


def test_the_gateway_publishes_its_checkpoint_with_its_service_account(installed: Installed, tmp_path: Path) -> None:
    """`corral mcp` with the rendered arguments, as the gateway's ServiceAccount: its first checkpoint (signed at
    start) reaches its AuditCheckpoint object, and nothing it does is refused."""
    container = container_of(installed.manifest, "gateway")
    args = list(container["args"])
    args[args.index("--port") + 1] = str(port := free_port())
    args[args.index("--host") + 1] = "127.0.0.1"
    mounted = mounted_files(installed, "gateway")
    assert set(mounted) == {"/etc/corral/audit-keys/gateway.pem"}, "the gateway's own key, nothing else"
    token = service_account_token(installed.admin, SYSTEM, f"{RELEASE}-gateway")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_for(installed.plane, token, tmp_path / "gw.kubeconfig", SYSTEM))}
    log = tmp_path / "gateway.log"
    with open(log, "ab") as out:
        gateway = subprocess.Popen([CORRAL, *localized(args, tmp_path, mounted)], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: gateway.poll() is None and healthz(port), f"the gateway to start (log {log})", timeout_s=30)
        published = wait_for(lambda: _checkpoint(installed.admin, "corral-gateway"),
                             f"the gateway's checkpoint (log {log})", timeout_s=15)
        assert published["key"] == "gateway"
    finally:
        gateway.terminate()
        gateway.wait(20)
    assert _checkpoint(installed.admin, "corral-gateway")["final"] is True  # signed as it stopped, published too
    text = log.read_text()
    assert not _refusals(text) and "could not be published" not in text, text[-3000:]


def test_helm_upgrade_keeps_the_keys_the_certificate_and_the_published_checkpoints(installed: Installed) -> None:
    core = kubernetes.client.CoreV1Api(installed.admin)
    objects = kubernetes.client.CustomObjectsApi(installed.admin)
    for name in (CONTROLLER_CHECKPOINT, "corral-gateway"):
        if not _checkpoint(installed.admin, name):  # as a component would have published it
            body = objects.get_namespaced_custom_object(GROUP, VERSION, SYSTEM, "auditcheckpoints", name)
            body["spec"] = {"number": 1, "seq": 0, "head": "0" * 64, "at": "2026-01-01T00:00:00Z",
                            "previous": "0" * 64, "key": name.removeprefix("corral-").split("-")[0], "sig": "c2ln"}
            objects.replace_namespaced_custom_object(GROUP, VERSION, SYSTEM, "auditcheckpoints", name, body)
    before = {name: _checkpoint(installed.admin, name) for name in (CONTROLLER_CHECKPOINT, "corral-gateway")}
    secrets = {name: core.read_namespaced_secret(name, SYSTEM).data
               for name in (f"{RELEASE}-audit-keys", f"{RELEASE}-controller-serving")}
    apiservices = kubernetes.client.ApiregistrationV1Api(installed.admin)
    ca_bundle = apiservices.read_api_service("v1alpha1.readings.corral.dev").spec.ca_bundle
    assert ca_bundle, "the init container published the serving CA (installed fixture)"
    installed.helm("upgrade", RELEASE, str(CHART), "-n", SYSTEM, "--reset-then-reuse-values",  # as the README says
                   "--set", "audit.checkpointInterval=120")
    manifest = [d for d in yaml.safe_load_all(installed.helm("get", "manifest", RELEASE, "-n", SYSTEM).stdout) if d]
    assert flag(container_of(manifest, "controller")["args"], "--audit-checkpoint-interval") == "120"
    assert {name: _checkpoint(installed.admin, name) for name in before} == before
    assert {name: core.read_namespaced_secret(name, SYSTEM).data for name in secrets} == secrets
    # Helm patches only what its template holds: the caBundle put in at run time stays.
    assert apiservices.read_api_service("v1alpha1.readings.corral.dev").spec.ca_bundle == ca_bundle


def kubeconfig_client(path: Path) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=str(path))


def _user(installed: Installed, name: str, role: str, person: bool = False) -> str:
    """A ServiceAccount bound to one of the chart's roles in HOME: an agent's, or (person) one of the people
    namespace, as an approver must be."""
    account_ns = PEOPLE_NAMESPACE if person else HOME
    if person:
        ensure_people_namespace(installed.admin)
    rbac = kubernetes.client.RbacAuthorizationV1Api(installed.admin)
    rbac.create_namespaced_role_binding(HOME, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{RELEASE}-{role}"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": account_ns}]})
    token = service_account_token(installed.admin, account_ns, name)
    wait_until_allowed(api_client(installed.plane, token=token), "get", HOME, "intents")
    return token


def _gone(objects: kubernetes.client.CustomObjectsApi, name: str) -> bool:
    try:
        objects.get_namespaced_custom_object("corral.dev", "v1alpha1", HOME, "intents", name)
        return False
    except kubernetes.client.ApiException as err:
        return err.status == 404


def test_rule_service_accounts_limit_what_the_controller_may_impersonate(helm: Helm) -> None:
    def impersonation(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [rule for d in docs if d["kind"] in ("ClusterRole", "Role") and "controller" in d["metadata"]["name"]
                for rule in d.get("rules") or [] if "impersonate" in rule["verbs"]]

    [anyone] = impersonation(render(helm))
    assert anyone["resources"] == ["serviceaccounts"] and "resourceNames" not in anyone
    [named] = impersonation(render(helm, "controller.ruleServiceAccounts={leak-guard,heating}"))
    assert named["resourceNames"] == ["leak-guard", "heating"]
    with pytest.raises(Exception, match="ruleServiceAccounts"):
        render(helm, "controller.ruleServiceAccounts={Not A Name}")
