"""The local plane is a real kube-apiserver: versioned, storing objects, enforcing RBAC."""

from __future__ import annotations

import kubernetes
import pytest

from corral.devcluster.kubebinary import kube_version, source_dir
from corral.devcluster.plane import Plane
from tests.harness import FIELD_MANAGER, api_client, apply_yaml, service_account_token, wait_for

pytestmark = pytest.mark.integration


def test_version_reports_the_pinned_release(kube: kubernetes.client.ApiClient) -> None:
    version = kubernetes.client.VersionApi(kube).get_code()
    assert version.git_version == kube_version(source_dir())
    assert (version.major, version.minor) == tuple(version.git_version.lstrip("v").split(".")[:2])


def test_configmap_round_trip_with_server_side_apply(kube: kubernetes.client.ApiClient, namespace: str) -> None:
    manifest = """
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {mode: "eco"}
"""
    apply_yaml(kube, manifest, namespace)
    core = kubernetes.client.CoreV1Api(kube)
    stored = core.read_namespaced_config_map("settings", namespace)
    assert stored.data == {"mode": "eco"}
    assert [m.manager for m in stored.metadata.managed_fields] == [FIELD_MANAGER]

    # Applying the same manifest again is a no-op on the server: no new resourceVersion.
    apply_yaml(kube, manifest, namespace)
    assert core.read_namespaced_config_map("settings", namespace).metadata.resource_version == (
        stored.metadata.resource_version
    )

    apply_yaml(kube, manifest.replace('"eco"', '"boost"'), namespace)
    assert core.read_namespaced_config_map("settings", namespace).data == {"mode": "boost"}


def test_rbac_denies_a_service_account_until_a_rolebinding_grants_it(
    plane: Plane, kube: kubernetes.client.ApiClient, namespace: str
) -> None:
    token = service_account_token(kube, namespace, "agent")
    as_agent = kubernetes.client.CoreV1Api(api_client(plane, token=token))

    with pytest.raises(kubernetes.client.ApiException) as denied:
        as_agent.list_namespaced_config_map(namespace)
    assert denied.value.status == 403
    assert f"system:serviceaccount:{namespace}:agent" in denied.value.body

    apply_yaml(
        kube,
        f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: configmap-reader}}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: agent-reads-configmaps}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-reader}}
subjects:
- {{kind: ServiceAccount, name: agent, namespace: {namespace}}}
""",
        namespace,
    )
    # The authorizer reads RBAC objects from a watch cache, so the grant lands within moments.
    wait_for(lambda: as_agent.list_namespaced_config_map(namespace) is not None, "the RoleBinding to take effect")

    # Granted in this namespace only, and only reading.
    with pytest.raises(kubernetes.client.ApiException) as still_denied:
        as_agent.create_namespaced_config_map(namespace, {"metadata": {"name": "x"}})
    assert still_denied.value.status == 403
    with pytest.raises(kubernetes.client.ApiException) as other_namespace:
        as_agent.list_namespaced_config_map("default")
    assert other_namespace.value.status == 403


def test_admin_can_impersonate_and_access_reviews_answer_for_the_impersonated_user(
    plane: Plane, namespace: str
) -> None:
    as_alice = api_client(plane, impersonate="alice")
    review = kubernetes.client.AuthorizationV1Api(as_alice).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"namespace": namespace, "verb": "list", "resource": "configmaps"}}}
    )
    assert review.status.allowed is False
    whoami = kubernetes.client.AuthenticationV1Api(as_alice).create_self_subject_review({})
    assert whoami.status.user_info.username == "alice"


def test_the_static_dev_user_is_authenticated_but_has_no_rights(plane: Plane, namespace: str) -> None:
    as_dev_user = api_client(plane, token=plane.user_token)
    whoami = kubernetes.client.AuthenticationV1Api(as_dev_user).create_self_subject_review({})
    assert whoami.status.user_info.username == "corral-dev-user"
    assert whoami.status.user_info.groups == ["system:authenticated"]
    with pytest.raises(kubernetes.client.ApiException) as denied:
        kubernetes.client.CoreV1Api(as_dev_user).list_namespaced_config_map(namespace)
    assert denied.value.status == 403
