"""The readings API as a real aggregated API on the local plane: the APIService `v1alpha1.readings.corral.dev`.

The local plane runs no Pods, so the controller runs on this machine, and the APIService points at an
ExternalName Service (`corral-system/corral-readings`, externalName `localhost`, the controller's serve port).
kube-apiserver runs with `--enable-aggregator-routing=false` (tools/kube), so it resolves that Service to
`localhost:PORT` and proxies there: over TLS, verifying the controller's certificate with the APIService's
caBundle for the name `corral-readings.corral-system.svc` (corral.serving.certs makes it for that name),
and presenting its front-proxy client certificate with the caller in X-Remote-* headers, which the
controller trusts through `corral run --requestheader-client-ca-file` (Plane.front_proxy_ca).

`register_readings_api` applies the three objects (server-side apply, field manager corral-dev) and waits
until the aggregator calls the APIService Available, or says why it does not.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import kubernetes
import yaml

from corral.api.codes import READINGS_GROUP as GROUP
from corral.api.codes import READINGS_VERSION as VERSION
from corral.client.apply import apply_yaml
from corral.devcluster.errors import DevClusterError
from corral.serving.certs import AGGREGATED_SERVICE

FIELD_MANAGER = "corral-dev"
NAMESPACE, SERVICE = AGGREGATED_SERVICE
APISERVICE = f"{VERSION}.{GROUP}"


def readings_api_objects(port: int, ca_pem: bytes, host: str = "localhost") -> list[dict[str, Any]]:
    """The Namespace, the ExternalName Service to host:port and the APIService that routes to it."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
         "spec": {"type": "ExternalName", "externalName": host,
                  "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
         "spec": {"group": GROUP, "version": VERSION,
                  "service": {"namespace": NAMESPACE, "name": SERVICE, "port": port},
                  "caBundle": base64.b64encode(ca_pem).decode(), "groupPriorityMinimum": 1000, "versionPriority": 15}},
    ]


def register_readings_api(client: kubernetes.client.ApiClient, port: int, ca_pem: bytes, *,
                          timeout_s: float = 60.0) -> dict[str, Any]:
    """Route /apis/readings.corral.dev/v1alpha1 to the controller serving on localhost:`port` with a certificate
    `ca_pem` signed; wait until the APIService is Available and its discovery answers through kube-apiserver,
    and return the condition. DevClusterError with the condition's reason and message (and the last answer of
    discovery) when that does not happen within `timeout_s`.

    Both, because the condition alone may be stale: applying an unchanged APIService triggers no new check, so
    an Available condition from an earlier registration can outlive the server it was about."""
    apply_yaml(client, yaml.safe_dump_all(readings_api_objects(port, ca_pem)), field_manager=FIELD_MANAGER,
               force=True)
    registration = kubernetes.client.ApiregistrationV1Api(client)
    objects = kubernetes.client.CustomObjectsApi(client)
    deadline = time.monotonic() + timeout_s
    while True:
        condition = available_condition(registration.read_api_service(APISERVICE))
        discovery = ""
        if condition.get("status") == "True":
            try:
                objects.get_api_resources(GROUP, VERSION)
                return condition
            except kubernetes.client.ApiException as err:
                discovery = f"; GET /apis/{GROUP}/{VERSION} through kube-apiserver: {err.status} {err.reason}"
        if time.monotonic() > deadline:
            why = ": ".join(str(part) for part in (condition.get("reason"), condition.get("message")) if part)
            raise DevClusterError(
                f"the APIService {APISERVICE} (Service {NAMESPACE}/{SERVICE} -> localhost:{port}) did not become "
                f"available within {timeout_s:.0f}s: {why or 'it has no Available condition yet'}{discovery}")
        time.sleep(0.25)


def unregister_readings_api(client: kubernetes.client.ApiClient) -> None:
    """Remove the APIService and its Service (an APIService nobody serves makes discovery fail for everyone)."""
    registration = kubernetes.client.ApiregistrationV1Api(client)
    core = kubernetes.client.CoreV1Api(client)
    for delete in (lambda: registration.delete_api_service(APISERVICE),
                   lambda: core.delete_namespaced_service(SERVICE, NAMESPACE)):
        try:
            delete()
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise


def available_condition(api_service: Any) -> dict[str, Any]:
    """The Available condition of an APIService (a V1APIService) as a dict; empty when it has none yet."""
    for condition in (api_service.status.conditions or []) if api_service.status else []:
        if condition.type == "Available":
            return {"status": condition.status, "reason": condition.reason, "message": condition.message}
    return {}
