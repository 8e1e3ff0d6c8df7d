"""The Helm chart: lint, template, install into a real API server, and least privilege proven both ways.

The local plane runs no Pods, so the installed Deployments never start. Instead the test takes the
controller's arguments from the rendered Deployment and runs `corral` with exactly those, as the
chart's controller ServiceAccount (a token minted for it): the end-to-end Intent flow then shows the
ClusterRole is sufficient, and refused requests with the same token show it is minimal.
"""

from __future__ import annotations

import base64
import getpass
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import kubernetes
import pytest
import yaml

from corral.api.roles import USER_ROLE_RULES
from corral.cli.main import cli
from corral.client.intents import decide_on, submit, wait_settled
from corral.devcluster import broker, files
from corral.devcluster.plane import DevPlane, Plane, find_mosquitto
from corral.devcluster.processes import accepts_connections, free_port
from tests.broker_harness import dynsec_at
from tests.controller_harness import CORRAL
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import kubeconfig_for
from tests.harness import api_client, healthz, service_account_token, wait_for, wait_until_allowed
from tests.helm_harness import KUBE_VERSION, Helm, helm_binary
from tests.mqtt5_harness import Account, client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "corral"
RELEASE, SYSTEM, HOME = "corral", "corral-system", "home"


@pytest.fixture(scope="module")
def helm(request: pytest.FixtureRequest) -> Helm:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    return Helm(helm_binary(lambda line: reporter.write_line(f"[helm] {line}") if reporter else print(line)))


# The chart requires contract signatures by default; most variants here are about something else.
UNSIGNED = "signing.require=false"


def render(helm: Helm, *sets: str) -> list[dict[str, Any]]:
    """The rendered documents; unsigned contracts unless `sets` say otherwise (a later --set wins)."""
    args = ["template", RELEASE, str(CHART), "-n", SYSTEM, "--kube-version", KUBE_VERSION]
    for value in (UNSIGNED, *sets):
        args += ["--set", value]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_helm_lint_passes_strictly(helm: Helm) -> None:
    done = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION)
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("sets", [
    (), ("mosquitto.enabled=true",), ("metrics.enabled=true", "metrics.serviceMonitor.enabled=true"),
    ("networkPolicy.enabled=true",), ("controller.watchNamespaces={a,b}",),
    ("signing.require=true", "signing.keysSecret=keys"), ("mqtt.username=u", "mqtt.password=p@ss"),
    ("mosquitto.enabled=true", "mosquitto.plainListener=true", "mqtt.manageAccounts=true"),
])
def test_every_variant_renders_restricted_workloads(helm: Helm, sets: tuple[str, ...]) -> None:
    docs = render(helm, *sets)
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"]
            assert container["livenessProbe"] and container["readinessProbe"]


@pytest.mark.parametrize("sets", [
    (), ("metrics.enabled=true", "gateway.deviceTools=true"), ("controller.watchNamespaces={a,b}",),
    ("signing.require=true", "signing.keysSecret=keys", "policy.approvals.medium=0", "telemetry.deadbands.rssi=5"),
])
def test_the_rendered_arguments_are_ones_corral_accepts(helm: Helm, sets: tuple[str, ...],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_MQTT_URL", "mqtt://broker:1883")  # from the Secret in a Pod
    for deployment in (d for d in render(helm, *sets) if d["kind"] == "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            args = container.get("args") or []
            if container.get("command") or not args or args[0] not in ("run", "mcp"):
                continue  # not a corral container (the bundled Mosquitto)
            command = cli.commands[args[0]]
            command.make_context(args[0], list(args[1:]))  # raises a UsageError on anything corral refuses


def test_the_default_install_requires_signed_contracts(helm: Helm) -> None:
    done = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, check=False)
    assert done.returncode != 0
    assert "signing.keysSecret is empty" in done.stderr and "signing.require=false" in done.stderr, done.stderr
    signed = render(helm, "signing.require=true", "signing.keysSecret=keys")
    args = find(signed, "Deployment", f"{RELEASE}-controller")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--require-signatures" in args


def test_values_outside_the_schema_are_refused(helm: Helm) -> None:
    for bad in ("metrics.port=abc", "nosuchvalue=1"):
        done = helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", bad, check=False)
        assert done.returncode != 0 and "values don't meet the specifications of the schema" in done.stderr, bad


def test_the_chart_user_roles_are_the_ones_corral_demo_installs(helm: Helm) -> None:
    docs = render(helm)
    for name, rules in USER_ROLE_RULES.items():
        assert find(docs, "ClusterRole", f"{RELEASE}-{name}")["rules"] == rules, name


def test_the_gateway_has_no_rights_of_its_own(helm: Helm) -> None:
    docs = render(helm)
    gateway_sa = f"{RELEASE}-gateway"
    bound = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s.get("name") == gateway_sa for s in d.get("subjects") or [])]
    assert bound == []


def test_the_bundled_broker_admits_only_its_accounts_over_tls(helm: Helm, tmp_path: Path) -> None:
    """The bundled Mosquitto exactly as rendered (its mosquitto.conf, generated certificates and the init
    container's `corral broker init-dynsec`), run by the local mosquitto: an anonymous client is refused,
    the controller's account is admitted over verified TLS and may run the dynamic security plugin."""
    docs = render(helm, "mosquitto.enabled=true", "mosquitto.tls.extraNames={127.0.0.1}")
    config = find(docs, "ConfigMap", f"{RELEASE}-mosquitto")["data"]["mosquitto.conf"]
    tls = {k: base64.b64decode(v) for k, v in find(docs, "Secret", f"{RELEASE}-mosquitto-tls")["data"].items()}
    ca = base64.b64decode(find(docs, "Secret", f"{RELEASE}-mosquitto-ca")["data"]["ca.crt"])
    assert ca == tls["ca.crt"] and b"PRIVATE" not in ca
    mqtt_secret = find(docs, "Secret", f"{RELEASE}-mqtt")["data"]
    password = base64.b64decode(mqtt_secret["controller-password"]).decode()
    url = urlsplit(base64.b64decode(mqtt_secret["url"]).decode())
    assert (url.scheme, url.port, unquote(url.password or "")) == ("mqtts", 8883, password)
    assert "allow_anonymous false" in config and "use_username_as_clientid true" in config
    assert "listener 1883" not in config, "plain MQTT is opt-in (mosquitto.plainListener)"

    root = tmp_path / "mosquitto"
    for part in ("config", "data", "certs"):
        (root / part).mkdir(parents=True)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (root / "certs" / name).write_bytes(tls[name])
    port = free_port()
    local = (config.replace("/mosquitto/", f"{root}/").replace("listener 8883", f"listener {port} 127.0.0.1")
             .replace(find_plugin_line(config), f"plugin {broker.plugin_path()}"))
    local += f"\n# Run as root, Mosquitto would switch to a user that cannot read the test's files.\nuser {getpass.getuser()}\n"
    (root / "config" / "mosquitto.conf").write_text(local)
    subprocess.run([CORRAL, "broker", "init-dynsec", "--file", str(root / "data" / "dynamic-security.json")],
                   env={**os.environ, "CORRAL_BROKER_CONTROLLER_PASSWORD": password}, check=True,
                   capture_output=True)
    log = root / "mosquitto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([find_mosquitto(), "-c", str(root / "config" / "mosquitto.conf")],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is None and accepts_connections(port),
                 f"the rendered broker to listen (log {log})", timeout_s=10)
        context = ssl.create_default_context(cafile=str(root / "certs" / "ca.crt"))
        assert _connack(port, context, None, None) in ("Not authorized", "Bad user name or password")
        assert _connack(port, context, files.BROKER_CONTROLLER, "wrong") in ("Not authorized",
                                                                             "Bad user name or password")
        assert _connack(port, context, files.BROKER_CONTROLLER, password) == "Success"
        answers = dynsec_at(port, (files.BROKER_CONTROLLER, password), [{"command": "listClients"}], tls=context)
        assert answers[0]["data"]["clients"] == [files.BROKER_CONTROLLER]
    finally:
        proc.kill()
        proc.wait(5)


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


@pytest.fixture(scope="module")
def installed(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The chart installed by `helm install` into a plane of its own (so the chart owns every Corral object)."""
    state = tmp_path_factory.mktemp("chart-plane")
    dev = DevPlane(state, progress=lambda line: None)
    plane = dev.up()
    try:
        admin = api_client(plane)
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": HOME}})
        helm_on_plane = Helm(helm.binary, plane.kubeconfig)
        helm_on_plane("install", RELEASE, str(CHART), "-n", SYSTEM, "--create-namespace", "--set", UNSIGNED, "--set", f"controller.watchNamespaces={{{HOME}}}",
                      "--set", f"controller.deviceNamespace={HOME}", "--set", "policy.intentTTLSeconds=3",
                      "--set", "mqtt.topicPrefix=chart")
        manifest = [d for d in yaml.safe_load_all(helm_on_plane("get", "manifest", RELEASE, "-n", SYSTEM).stdout) if d]
        container = find(manifest, "Deployment", f"{RELEASE}-controller")["spec"]["template"]["spec"]["containers"][0]
        token = service_account_token(admin, SYSTEM, f"{RELEASE}-controller")
        kubeconfig = kubeconfig_for(plane, token, state / "controller.kubeconfig", SYSTEM)
        yield Installed(plane, admin, helm_on_plane, kubeconfig, list(container["args"]))
    finally:
        dev.down(purge=True)


def test_helm_install_creates_the_release_with_crds_and_policies(installed: Installed) -> None:
    status = installed.helm.status(RELEASE, SYSTEM)
    assert status["info"]["status"] == "deployed"
    ext = kubernetes.client.ApiextensionsV1Api(installed.admin)
    assert {c.metadata.name for c in ext.list_custom_resource_definition().items} >= {
        "devices.corral.dev", "intents.corral.dev", "approvals.corral.dev", "capabilities.corral.dev"}
    policies = kubernetes.client.AdmissionregistrationV1Api(installed.admin).list_validating_admission_policy()
    assert policies.items, "the admission policies are part of the release"


def test_the_controller_runs_end_to_end_with_only_the_chart_rbac(installed: Installed, tmp_path: Path) -> None:
    plane, admin = installed.plane, installed.admin
    args = list(installed.controller_args)
    args[args.index("--health-port") + 1] = str(health := free_port())
    env = {**os.environ, "KUBECONFIG": str(installed.controller_kubeconfig), "CORRAL_MQTT_URL": plane.mqtt_url_as(files.BROKER_CONTROLLER)}
    agent_token = _user(installed, "agent", "agent-operator")
    approver_token = _user(installed, "approver", "approver")
    agent = api_client(plane, token=agent_token)
    log = tmp_path / "controller.log"
    with running_fleet(plane, "chart", {"porch-light": "light", "back-lock": "lock"},
                       enroll_in=(admin, HOME)) as fleet, open(log, "ab") as out:
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
        finally:
            controller.terminate()
            controller.wait(20)
    assert "403" not in log.read_text() and "Forbidden" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.parametrize(("verb", "group", "resource", "namespace"), [
    ("get", "", "secrets", SYSTEM), ("list", "", "secrets", "default"), ("create", "", "secrets", HOME),
    ("delete", "corral.dev", "devices", HOME), ("create", "corral.dev", "devices", HOME),
    ("update", "corral.dev", "devices", HOME), ("create", "corral.dev", "intents", HOME),
    ("create", "corral.dev", "approvals", HOME), ("update", "corral.dev", "capabilities", None),
    ("create", "", "pods", HOME), ("list", "", "configmaps", HOME), ("create", "rbac.authorization.k8s.io", "rolebindings", HOME),
    ("impersonate", "", "users", None), ("create", "authentication.k8s.io", "tokenreviews", None),
])
def test_the_controller_service_account_can_do_nothing_else(
        installed: Installed, verb: str, group: str, resource: str, namespace: str | None) -> None:
    controller = kubeconfig_client(installed.controller_kubeconfig)
    review = kubernetes.client.AuthorizationV1Api(controller).create_self_subject_access_review({"spec": {
        "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace}}})
    assert review.status.allowed is False, f"the controller may {verb} {resource} in {namespace}"


def test_the_gateway_service_account_can_read_nothing(installed: Installed, tmp_path: Path) -> None:
    token = service_account_token(installed.admin, SYSTEM, f"{RELEASE}-gateway")
    gateway = kubeconfig_client(kubeconfig_for(installed.plane, token, tmp_path / "gw.kubeconfig", SYSTEM))
    for verb, resource in (("list", "devices"), ("create", "intents"), ("get", "capabilities")):
        review = kubernetes.client.AuthorizationV1Api(gateway).create_self_subject_access_review({"spec": {
            "resourceAttributes": {"verb": verb, "group": "corral.dev", "resource": resource, "namespace": HOME}}})
        assert review.status.allowed is (resource == "capabilities" and verb == "get"), (verb, resource)


def kubeconfig_client(path: Path) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=str(path))


def _user(installed: Installed, name: str, role: str) -> str:
    rbac = kubernetes.client.RbacAuthorizationV1Api(installed.admin)
    rbac.create_namespaced_role_binding(HOME, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{RELEASE}-{role}"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": HOME}]})
    token = service_account_token(installed.admin, HOME, name)
    wait_until_allowed(api_client(installed.plane, token=token), "get", HOME, "intents")
    return token


def _gone(objects: kubernetes.client.CustomObjectsApi, name: str) -> bool:
    try:
        objects.get_namespaced_custom_object("corral.dev", "v1alpha1", HOME, "intents", name)
        return False
    except kubernetes.client.ApiException as err:
        return err.status == 404
