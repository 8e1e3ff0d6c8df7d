"""`corral people add NAME -n NS`: a person who can sign in and, by default, see and decide what waits in NS.

Without the approver role a person signs in to a page that says "You may not list Intents" and then "Nothing is
waiting": a dead end. The command binds the role by default, says what the person can now do, and refuses
up front (creating nothing) when the role it would bind does not exist.
"""

from __future__ import annotations

import kubernetes
import pytest
from click.testing import CliRunner

from corral.api.codes import PEOPLE_NAMESPACE
from corral.cli.main import cli
from corral.devcluster.plane import Plane
from tests.harness import api_client, apply_yaml, ensure_people_namespace

pytestmark = pytest.mark.integration

APPROVER_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: corral-approver}
rules:
- {apiGroups: [corral.dev], resources: [devices], verbs: [get, list, watch, read, approve]}
- {apiGroups: [corral.dev], resources: [intents], verbs: [get, list, watch, create]}
- {apiGroups: [corral.dev], resources: [approvals], verbs: [get, list, create]}
"""


def _can(client: kubernetes.client.ApiClient, namespace: str, verb: str, resource: str) -> bool:
    review = {"spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": "corral.dev",
                                              "resource": resource}}}
    answer = kubernetes.client.AuthorizationV1Api(client).create_self_subject_access_review(review)
    return bool(answer.status.allowed)


def _cluster_role_exists(client: kubernetes.client.ApiClient, name: str) -> bool:
    try:
        kubernetes.client.RbacAuthorizationV1Api(client).read_cluster_role(name)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def _add(plane: Plane, namespace: str, *args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, ["people", "add", *args, "-n", namespace, "--kubeconfig", str(plane.kubeconfig)])
    return done.exit_code, done.stdout, done.stderr


def test_a_person_added_may_see_and_approve_what_waits_in_the_namespace_and_is_told_so(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str) -> None:
    apply_yaml(corral_api, APPROVER_ROLE, namespace)
    person, bare = f"{namespace}-alice"[:63], f"{namespace}-bob"[:63]
    code, token, said = _add(plane, namespace, person)
    assert code == 0, said
    # A ClusterRole of that name (the chart's, or one another test installed on this shared plane) is preferred.
    kind = "ClusterRole" if _cluster_role_exists(corral_api, "corral-approver") else "Role"
    assert f"approve or deny them, as themselves ({kind} corral-approver, RoleBinding corral-approver-{person} in " \
           f"{namespace})" in said and "sign in to the approval page" in said
    alice = api_client(plane, token=token.strip())
    assert _can(alice, namespace, "list", "intents") and _can(alice, namespace, "approve", "devices")
    # The control: a person added without the role signs in to nothing, and is told how to fix it.
    code, token, said = _add(plane, namespace, bare, "--no-approver-role")
    assert code == 0 and f"corral people add {bare} -n {namespace} (binds corral-approver)" in said, said
    bob = api_client(plane, token=token.strip())
    assert not _can(bob, namespace, "list", "intents")


def test_a_missing_approver_role_is_refused_before_anything_is_made(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str) -> None:
    person = f"{namespace}-carol"[:63]
    ensure_people_namespace(corral_api)
    code, token, said = _add(plane, namespace, person, "--approver-role", "no-such-role")
    assert code == 1 and token == ""
    assert f"there is no ClusterRole no-such-role, nor a Role no-such-role in {namespace}" in said
    assert "--no-approver-role" in said and "examples/rbac/dev-users.yaml" in said
    accounts = kubernetes.client.CoreV1Api(corral_api).list_namespaced_service_account(PEOPLE_NAMESPACE).items
    assert person not in {a.metadata.name for a in accounts}
