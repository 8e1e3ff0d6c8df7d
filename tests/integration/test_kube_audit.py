"""Kubernetes' own audit on the local plane: kube-apiserver records who wrote which corral.dev object, with the
request body, and nothing else (files.kube_audit_policy, the same policy the chart README gives k3s users)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import kubernetes
import pytest

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.devcluster.files import ADMIN_USER, DEV_USER
from corral.devcluster.plane import Plane
from tests.harness import api_client, apply_yaml, wait_for, wait_until_allowed

pytestmark = pytest.mark.integration

APPROVER_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: audit-approver}}
rules:
- {{apiGroups: [corral.dev], resources: [approvals], verbs: [create, get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: audit-approver}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: audit-approver}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]
"""


def audit_events(plane: Plane, mentioning: str) -> list[dict[str, Any]]:
    """The audit log's events whose line mentions `mentioning` (a unique object name)."""
    with plane.audit_log.open() as log:
        return [json.loads(line) for line in log if mentioning in line]


def test_kube_apiserver_audits_who_created_an_approval_and_skips_other_writes(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str
) -> None:
    admin = corral_api
    objects = kubernetes.client.CustomObjectsApi(admin)
    suffix = uuid.uuid4().hex[:8]

    # A write outside corral.dev, made first: had it been recorded, it would be in the log before the Approval.
    configmap = f"audit-not-recorded-{suffix}"
    kubernetes.client.CoreV1Api(admin).create_namespaced_config_map(
        namespace, {"metadata": {"name": configmap}, "data": {"k": "v"}})

    intent = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "intents", {
        "apiVersion": API_VERSION, "kind": "Intent", "metadata": {"name": f"audit-intent-{suffix}"},
        "spec": {"device": "front-lock", "actuator": "locked", "action": "set_state", "params": {"value": True},
                 "reason": "audit test", "requester": ADMIN_USER},
    })

    # The plane's second identity, with no rights but creating Approvals here.
    apply_yaml(admin, APPROVER_ROLE.format(user=DEV_USER), namespace)
    as_user = api_client(plane, token=plane.user_token)
    wait_until_allowed(as_user, "create", namespace, "approvals")
    name = f"audit-approval-{suffix}"
    kubernetes.client.CustomObjectsApi(as_user).create_namespaced_custom_object(GROUP, VERSION, namespace, "approvals", {
        "apiVersion": API_VERSION, "kind": "Approval", "metadata": {"name": name},
        "spec": {"intent": {"name": intent["metadata"]["name"], "uid": intent["metadata"]["uid"]},
                 "paramsHash": "0" * 64, "decision": "Approve", "approver": DEV_USER, "reason": "audit test"},
    })

    def approval_created() -> list[dict[str, Any]]:
        return [e for e in audit_events(plane, name)
                if e.get("verb") == "create" and e.get("stage") == "ResponseComplete"
                and e["objectRef"].get("resource") == "approvals" and e["objectRef"].get("apiGroup") == "corral.dev"
                and e["objectRef"].get("name") == name]

    event = wait_for(approval_created, f"the audit log ({plane.audit_log}) to record Approval {name}", timeout_s=20)[0]
    assert event["user"]["username"] == DEV_USER
    assert event["level"] == "RequestResponse"
    assert event["objectRef"]["namespace"] == namespace
    assert event["requestObject"]["spec"]["approver"] == DEV_USER
    assert event["responseObject"]["metadata"]["name"] == name
    assert event["responseStatus"]["code"] == 201

    intent_events = audit_events(plane, intent["metadata"]["name"])
    assert any(e["verb"] == "create" and e["objectRef"]["resource"] == "intents"
               and e["user"]["username"] == ADMIN_USER for e in intent_events), intent_events
    # Neither the ConfigMap nor the RBAC objects (other groups) nor any stage RequestReceived is recorded.
    assert audit_events(plane, configmap) == []
    assert not [e for e in audit_events(plane, namespace) if e["objectRef"].get("apiGroup") != "corral.dev"]
    assert not [e for e in audit_events(plane, suffix) if e["stage"] == "RequestReceived"]
