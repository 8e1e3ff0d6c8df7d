"""The readings API as a real aggregated API on the local plane, and who may speak for a caller.

kube-apiserver (with its front proxy, tools/kube) routes the APIService v1alpha1.readings.corral.dev to the
real controller through an ExternalName Service to localhost (corral.devcluster.readings_api), presenting
its front-proxy client certificate and the caller in X-Remote-* headers; the controller believes those
headers only over that certificate (`corral run --requestheader-client-ca-file`). Directly, a forged header
gets 401 and a client certificate of another CA does not even complete the handshake.

One namespace, sensor, controller and APIService for the module; the APIService is removed at the end, since
one nobody serves would make API discovery fail for the rest of the session.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.client.pki import KeyPair, issue, new_ca
from corral.devcluster.plane import Plane
from corral.devcluster.readings_api import register_readings_api, unregister_readings_api
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import running_fleet
from tests.gateway_harness import kubeconfig_for
from tests.harness import apply_yaml, fresh_namespace, service_account_token, wait_for, wait_until_allowed

pytestmark = pytest.mark.integration

SENSOR = "hall-climate"
API = "/apis/readings.corral.dev/v1alpha1"

# Through the aggregator a caller needs two grants: `get` on the aggregated resource, which kube-apiserver
# checks before it proxies, and `listen` on the Device, which the controller checks itself.
ROLES = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: readings-listener}}
rules:
- {{apiGroups: [readings.corral.dev], resources: [devices], verbs: [get]}}
- {{apiGroups: [corral.dev], resources: [devices], resourceNames: [{sensor}], verbs: [get, listen]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: readings-deaf}}
rules:
- {{apiGroups: [readings.corral.dev], resources: [devices], verbs: [get]}}
- {{apiGroups: [corral.dev], resources: [devices], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: readings-direct-only}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], resourceNames: [{sensor}], verbs: [listen]}}
"""
BINDING = """
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {role}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {role}}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {namespace}}}]
"""
ACCOUNTS = {"listener": "readings-listener", "deaf": "readings-deaf", "direct-only": "readings-direct-only"}


@dataclass
class Aggregated:
    plane: Plane
    namespace: str
    controller: ControllerProcess
    kubeconfigs: dict[str, Path]  # per ServiceAccount of ACCOUNTS
    tokens: dict[str, str]
    tmp: Path

    @property
    def device_path(self) -> str:
        return f"{API}/namespaces/{self.namespace}/devices/{SENSOR}"

    def get_raw(self, who: str, path: str) -> subprocess.CompletedProcess[str]:
        """`kubectl get --raw PATH` as that ServiceAccount, through kube-apiserver."""
        return subprocess.run([str(self.plane.kubectl), f"--kubeconfig={self.kubeconfigs[who]}", "get", "--raw", path],
                              capture_output=True, text=True, timeout=30)

    def through_apiserver(self, who: str, path: str) -> tuple[int, str]:
        """The same GET as `kubectl get --raw`, for its HTTP status."""
        request = urllib.request.Request(self.plane.server + path,
                                         headers={"Authorization": f"Bearer {self.tokens[who]}"})
        return _fetch(request, ssl.create_default_context(cafile=str(self.plane.ca_file)))

    def direct(self, path: str, headers: dict[str, str], client: KeyPair | None = None) -> tuple[int, str]:
        """GET on the controller's own HTTPS port (not through kube-apiserver), optionally with a client cert."""
        context = ssl.create_default_context(cafile=str(self.controller.serve_ca))
        if client is not None:
            (cert := self.tmp / "client.crt").write_bytes(client.cert_pem)
            (key := self.tmp / "client.key").write_bytes(client.key_pem)
            context.load_cert_chain(str(cert), str(key))
        return _fetch(urllib.request.Request(self.controller.serve_url + path, headers=headers), context)


def _fetch(request: urllib.request.Request, context: ssl.SSLContext) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture(scope="module")
def aggregated(plane: Plane, corral_api: kubernetes.client.ApiClient, kube: kubernetes.client.ApiClient,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Aggregated]:
    tmp = tmp_path_factory.mktemp("readings-api")
    with fresh_namespace(kube, "readings-api") as namespace:
        apply_yaml(corral_api, ROLES.format(sensor=SENSOR), namespace)
        kubeconfigs, tokens = {}, {}
        for account, role in ACCOUNTS.items():
            apply_yaml(corral_api, BINDING.format(role=role, account=account, namespace=namespace), namespace)
            tokens[account] = service_account_token(corral_api, namespace, account)
            kubeconfigs[account] = kubeconfig_for(plane, tokens[account], tmp / f"{account}.kubeconfig", namespace)
        wait_until_allowed(kubernetes.config.new_client_from_config(str(kubeconfigs["deaf"])), "get", namespace,
                           "devices", group="readings.corral.dev")
        prefix = f"rda-{namespace[-6:]}"
        with running_fleet(plane, prefix, {SENSOR: "sht30"}, enroll_in=(corral_api, namespace),
                           telemetry_interval_s=0.5):
            controller = ControllerProcess(plane, namespace, prefix, tmp / "controller.log",
                                           "--requestheader-client-ca-file", str(plane.front_proxy_ca))
            controller.start()
            try:
                wait_for(lambda: (device(corral_api, namespace, SENSOR).get("status") or {}).get("online"),
                         "the sensor online", timeout_s=30)
                register_readings_api(kube, controller.serve_port, controller.serve_ca.read_bytes(), timeout_s=30)
                yield Aggregated(plane, namespace, controller, kubeconfigs, tokens, tmp)
            finally:
                unregister_readings_api(kube)
                controller.stop()


def test_the_plane_publishes_its_front_proxy_ca_apart_from_the_cluster_ca(
        aggregated: Aggregated, kube: kubernetes.client.ApiClient) -> None:
    published = kubernetes.client.CoreV1Api(kube).read_namespaced_config_map(
        "extension-apiserver-authentication", "kube-system").data
    assert published["requestheader-client-ca-file"].strip() == aggregated.plane.front_proxy_ca.read_text().strip()
    assert published["requestheader-client-ca-file"].strip() != published["client-ca-file"].strip()
    assert json.loads(published["requestheader-allowed-names"]) == ["front-proxy-client"]
    assert json.loads(published["requestheader-username-headers"]) == ["X-Remote-User"]


def test_a_forged_remote_user_without_a_client_certificate_gets_401(aggregated: Aggregated) -> None:
    status, body = aggregated.direct(aggregated.device_path, {"X-Remote-User": "system:admin",
                                                              "X-Remote-Group": "system:masters"})
    assert status == 401, body
    assert "front proxy" in json.loads(body)["message"]


def test_a_client_certificate_of_another_ca_is_not_the_front_proxy(aggregated: Aggregated) -> None:
    # Signed by a CA of its own, named as the front proxy is: the TLS handshake already refuses it (the
    # controller trusts only the requestheader CA for client certificates), so no header is ever read.
    impostor = issue(new_ca("impostor-ca"), "front-proxy-client", client=True)
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        aggregated.direct(aggregated.device_path, {"X-Remote-User": "system:admin"}, client=impostor)
    # Signed by the real front-proxy CA (its key is in the plane's state directory), under another name: 401.
    pki = aggregated.plane.state_dir / "kube" / "pki"
    front_ca = KeyPair((pki / "front-proxy-ca.key").read_bytes(), (pki / "front-proxy-ca.crt").read_bytes())
    status, body = aggregated.direct(aggregated.device_path, {"X-Remote-User": "system:admin"},
                                     client=issue(front_ca, "not-the-front-proxy", client=True))
    assert status == 401 and "not-the-front-proxy" in body, body


def test_through_the_aggregator_a_caller_with_listen_reads_the_samples(aggregated: Aggregated) -> None:
    discovery = aggregated.get_raw("deaf", API)
    assert discovery.returncode == 0, discovery.stderr
    assert json.loads(discovery.stdout)["groupVersion"] == "readings.corral.dev/v1alpha1"

    def samples() -> dict[str, Any]:
        done = aggregated.get_raw("listener", aggregated.device_path + "?metrics=temperature&window_s=30")
        assert done.returncode == 0, done.stderr
        document: dict[str, Any] = json.loads(done.stdout)
        return document if document["metrics"].get("temperature", {}).get("samples") else {}

    document = wait_for(samples, "temperature samples through the aggregator", timeout_s=20, interval_s=0.5)
    assert document["kind"] == "DeviceReadings"
    assert document["metadata"] == {"name": SENSOR, "namespace": aggregated.namespace}
    assert set(document["metrics"]) == {"temperature"}
    sample = document["metrics"]["temperature"]["samples"][-1]
    assert {"ts", "value", "receivedAt"} <= set(sample), sample


def test_through_the_aggregator_a_caller_without_listen_is_forbidden_by_the_controller(
        aggregated: Aggregated) -> None:
    # The controller's own refusal, for the identity the front proxy named (not kube-apiserver's RBAC, which
    # let `get` on the aggregated resource through).
    said = f"system:serviceaccount:{aggregated.namespace}:deaf may not read the samples"
    refused = aggregated.get_raw("deaf", aggregated.device_path)
    assert refused.returncode != 0 and said in refused.stderr, refused.stderr
    status, body = aggregated.through_apiserver("deaf", aggregated.device_path)
    assert status == 403 and said in json.loads(body)["message"], body


def test_kube_apiserver_itself_requires_get_on_the_aggregated_resource(aggregated: Aggregated) -> None:
    # `listen` alone is enough directly (with the caller's own token) but not through the aggregator.
    refused = aggregated.get_raw("direct-only", aggregated.device_path)
    assert refused.returncode != 0
    assert 'Error from server (Forbidden)' in refused.stderr, refused.stderr
    assert 'cannot get resource "devices" in API group "readings.corral.dev"' in refused.stderr, refused.stderr
    status, _ = aggregated.direct(aggregated.device_path, {"Authorization": f"Bearer {aggregated.tokens['direct-only']}"})
    assert status == 200
