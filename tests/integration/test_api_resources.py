"""Corral's CRDs and admission policies on the real API server: examples, refusals, columns, identities."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from corral.api import (
    KINDS,
    AgentPause,
    Approval,
    ApprovalGrant,
    AuditCheckpoint,
    Capability,
    Device,
    DiscoveredDevice,
    Intent,
    Interlock,
    Rule,
)
from corral.api.codes import GROUP, VERSION
from corral.client.install import install_api
from corral.devcluster.plane import Plane
from tests.harness import api_client, apply_yaml, kubectl, service_account_token, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLURALS = {kind.kind_name: kind.plural for kind in KINDS}


def _identity(path: Path, doc: dict[str, Any]) -> str:
    """Who applies an example: `# as: USER` in its header, else the requester/approver/author it names."""
    match = re.search(r"^# as: (\S+)$", path.read_text(), re.MULTILINE)
    if match:
        return match.group(1)
    spec = doc.get("spec", {})
    return spec.get("requester") or spec.get("approver") or spec.get("author") or "corral-admin"


def _apply_as(plane: Plane, path: Path, namespace: str) -> list[object]:
    doc = yaml.safe_load(path.read_text())
    # system:masters so that only the schema and the policies can say no, not RBAC.
    client = api_client(plane, impersonate=_identity(path, doc), group="system:masters")
    return apply_yaml(client, path.read_text(), namespace)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_applies_and_parses_back_into_its_model(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, path: Path
) -> None:
    (stored,) = _apply_as(plane, path, namespace)
    raw = stored.to_dict()
    model = {k.kind_name: k for k in KINDS}[raw["kind"]]
    assert model.model_validate(raw).model_dump(mode="json", exclude_unset=True) == raw
    if raw["kind"] == "Capability":
        kubernetes.client.CustomObjectsApi(corral_api).delete_cluster_custom_object(
            GROUP, VERSION, "capabilities", raw["metadata"]["name"]
        )


@pytest.mark.parametrize("path", sorted((EXAMPLES / "invalid").glob("*.yaml")), ids=lambda p: p.name)
def test_every_invalid_example_is_refused_with_a_readable_message(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, path: Path
) -> None:
    expected = re.search(r"^# expect: (.+)$", path.read_text(), re.MULTILINE)
    assert expected, f"{path.name} needs a '# expect: <message>' line"
    with pytest.raises(kubernetes.client.ApiException) as refused:
        _apply_as(plane, path, namespace)
    assert refused.value.status in (403, 422)
    message = yaml.safe_load(refused.value.body)["message"]
    assert expected.group(1) in message


def test_kubectl_explain_describes_device_target(plane: Plane, corral_api: kubernetes.client.ApiClient) -> None:
    explained = kubectl(plane, "explain", "device.spec.target").stdout
    assert "FIELD: target <map[string]Object>" in explained
    assert "Desired actuator states, actuator id -> value" in explained


def test_kubectl_get_shows_the_documented_columns(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str
) -> None:
    for name in ("device.yaml", "intent.yaml", "approval.yaml"):
        _apply_as(plane, EXAMPLES / name, namespace)
    out = kubectl(plane, "get", "devices,intents,approvals", "-n", namespace).stdout
    headers = [line.split() for line in out.splitlines() if line.startswith("NAME")]
    assert headers == [
        ["NAME", "ONLINE", "ALIAS", "LOCATION", "IN-SYNC", "AGE"],
        ["NAME", "DEVICE", "ACTION", "PHASE", "CODE", "REQUESTER", "AGE"],
        ["NAME", "INTENT", "DECISION", "APPROVER", "REFUSED", "AGE"],
    ]
    assert "kitchen fan" in out and "fan-up-20261130-0001" in out
    # The `corral` category lists all of them at once.
    assert "device.corral.dev/kitchen-env-1" in kubectl(plane, "get", "corral", "-n", namespace).stdout


def _intent(name: str, requester: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Intent",
        "metadata": {"name": name},
        "spec": {
            "device": "kitchen-env-1",
            "actuator": "fan",
            "action": "set_level",
            "params": {"value": "high"},
            "reason": "It is hot.",
            "requester": requester,
        },
    }


def test_an_intent_must_name_its_creator_as_requester(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str
) -> None:
    apply_yaml(
        corral_api,
        f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: intent-maker}}
rules:
- {{apiGroups: [corral.dev], resources: [intents], verbs: [create, get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: agents-make-intents}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: intent-maker}}
subjects:
- {{kind: ServiceAccount, name: agent-a, namespace: {namespace}}}
- {{kind: ServiceAccount, name: agent-b, namespace: {namespace}}}
""",
        namespace,
    )
    agent_a = f"system:serviceaccount:{namespace}:agent-a"
    agent_b = f"system:serviceaccount:{namespace}:agent-b"
    as_a = kubernetes.client.CustomObjectsApi(
        api_client(plane, token=service_account_token(corral_api, namespace, "agent-a"))
    )
    service_account_token(corral_api, namespace, "agent-b")

    def create(body: dict[str, Any]) -> dict[str, Any]:
        return as_a.create_namespaced_custom_object(GROUP, VERSION, namespace, "intents", body)

    # RBAC bindings reach the authorizer through a watch; wait until A may create at all.
    wait_for(lambda: create(_intent("probe", agent_a)), "agent-a's RoleBinding to take effect")

    with pytest.raises(kubernetes.client.ApiException) as forged:
        create(_intent("as-b", agent_b))
    assert forged.value.status == 403
    assert f'you are "{agent_a}" but the Intent says "{agent_b}"' in yaml.safe_load(forged.value.body)["message"]

    created = create(_intent("as-a", agent_a))
    assert created["spec"]["requester"] == agent_a


def test_device_id_cannot_change(corral_api: kubernetes.client.ApiClient, namespace: str) -> None:
    apply_yaml(corral_api, (EXAMPLES / "device.yaml").read_text(), namespace)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        kubernetes.client.CustomObjectsApi(corral_api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "devices", "kitchen-env-1", {"spec": {"deviceId": "other-device"}}
        )
    assert refused.value.status == 422
    assert "deviceId is immutable" in refused.value.body


def test_intent_spec_and_approver_cannot_change(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str
) -> None:
    _apply_as(plane, EXAMPLES / "intent.yaml", namespace)
    _apply_as(plane, EXAMPLES / "approval.yaml", namespace)
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    with pytest.raises(kubernetes.client.ApiException) as intent_change:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "intents", "fan-up-20261130-0001", {"spec": {"params": {"value": "low"}}}
        )
    assert "an Intent's spec is immutable" in intent_change.value.body
    with pytest.raises(kubernetes.client.ApiException) as approver_change:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "approvals", "fan-up-20261130-0001-approve", {"spec": {"approver": "mallory"}}
        )
    assert approver_change.value.status in (403, 422)


def test_status_round_trips_through_the_status_subresource(
    corral_api: kubernetes.client.ApiClient, namespace: str
) -> None:
    apply_yaml(corral_api, (EXAMPLES / "device.yaml").read_text(), namespace)
    status = {
        "online": True,
        "lastSeen": "2026-11-30T10:00:00.250000Z",
        "capability": "corral-env-fan-10266f5ac9f2e155",
        "reported": {"fan": "low", "heater": False, "brightness": 42.5},
        "sensors": {"temperature": {"value": 21.5, "unit": "°C", "timestamp": "2026-11-30T10:00:00Z"}},
        "inSync": True,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Online",
                "message": "device answered",
                "lastTransitionTime": "2026-11-30T10:00:00Z",
                "observedGeneration": 1,
            }
        ],
        "observedGeneration": 1,
    }
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    # The spec is not writable through the status subresource, and status not through the main resource.
    objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, "devices", "kitchen-env-1", {"status": status})
    assert "status" not in objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "devices", "kitchen-env-1")
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "devices", "kitchen-env-1", {"status": status}
    )
    raw = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "devices", "kitchen-env-1")
    device = Device.model_validate(raw)
    assert device.status is not None and device.status.reported == {"fan": "low", "heater": False, "brightness": 42.5}
    assert device.model_dump(mode="json", exclude_unset=True) == raw


def test_models_cover_every_kind() -> None:
    assert {k.kind_name for k in KINDS} == {"Device", "Capability", "Intent", "Approval", "AuditCheckpoint",
                                            "Interlock", "ApprovalGrant", "AgentPause", "Rule", "DiscoveredDevice"}
    assert {Device, Capability, Intent, Approval, AuditCheckpoint, Interlock, ApprovalGrant, AgentPause,
            Rule, DiscoveredDevice} == set(KINDS)


def test_the_readmes_kubectl_apply_works_after_the_demo_installed_the_api_and_before_it(
        plane: Plane, corral_api: kubernetes.client.ApiClient) -> None:
    """`./scripts/up` then the README's step-by-step `kubectl apply --server-side -f crds/`, and back."""
    install_api(corral_api, field_manager="corral-demo")
    applied = kubectl(plane, "apply", "--server-side", "-f", str(REPO / "crds"), check=False)
    assert applied.returncode == 0, applied.stderr
    install_api(corral_api, field_manager="corral-demo")


def _refusal(err: kubernetes.client.ApiException) -> str:
    assert err.status == 403, err.body
    return str(yaml.safe_load(err.body)["message"])


def test_an_intent_belongs_to_its_requester_others_cannot_touch_its_metadata(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str
) -> None:
    """The attack: the agent (which may patch Intents, to cancel its own) rewrote the trace id of an admin's Intent,
    which the admin's signed audit records then carried, and held it with a finalizer of its own."""
    apply_yaml(corral_api, f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: agent-intents}}
rules: [{{apiGroups: [corral.dev], resources: [intents], verbs: [get, create, patch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: agent-intents}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: agent-intents}}
subjects: [{{kind: ServiceAccount, name: agent, namespace: {namespace}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: controller-intents}}
rules:
- {{apiGroups: [corral.dev], resources: [intents], verbs: [get, patch]}}
- {{apiGroups: [corral.dev], resources: [intents/status], verbs: [patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: controller-intents}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: controller-intents}}
subjects: [{{kind: ServiceAccount, name: controller, namespace: {namespace}}}]
""", namespace)
    agent_name = f"system:serviceaccount:{namespace}:agent"
    agent = kubernetes.client.CustomObjectsApi(api_client(plane, token=service_account_token(corral_api, namespace,
                                                                                             "agent")))
    controller = kubernetes.client.CustomObjectsApi(
        api_client(plane, token=service_account_token(corral_api, namespace, "controller")))
    admin = kubernetes.client.CustomObjectsApi(api_client(plane, impersonate="corral-admin", group="system:masters"))
    admins_trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    agents_trace = "00-11111111111111111111111111111111-2222222222222222-01"
    mine = {**_intent("admins", "corral-admin"), "metadata": {
        "name": "admins", "annotations": {"corral.dev/traceparent": admins_trace}}}
    admin.create_namespaced_custom_object(GROUP, VERSION, namespace, "intents", mine)
    wait_for(lambda: agent.create_namespaced_custom_object(GROUP, VERSION, namespace, "intents",
                                                          _intent("agents", agent_name)),
             "the agent's RoleBinding to take effect")

    def patch(who: Any, name: str, metadata: dict[str, Any]) -> dict[str, Any]:
        return who.patch_namespaced_custom_object(GROUP, VERSION, namespace, "intents", name, {"metadata": metadata})

    attacks = {
        "trace annotation": {"annotations": {"corral.dev/traceparent": agents_trace}},
        "finalizer": {"finalizers": ["agent.example/hold"]},
        "label": {"labels": {"owner": "agent"}},
    }
    for what, metadata in attacks.items():
        with pytest.raises(kubernetes.client.ApiException) as refused:
            patch(agent, "admins", metadata)
        message = _refusal(refused.value)
        assert "corral-intent-requester" in message, what
        assert "belongs to its requester (corral-admin)" in message and f"you are {agent_name}" in message, what
    stored = admin.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", "admins")["metadata"]
    assert stored["annotations"]["corral.dev/traceparent"] == admins_trace and not stored.get("finalizers")

    # Positive controls: the requester still cancels (and labels) its own Intent ...
    patch(agent, "agents", {"annotations": {"corral.dev/cancel": "changed my mind"}, "labels": {"batch": "1"}})
    # ... and whoever writes Intents' status (the controller's right) still writes it, and may touch metadata.
    controller.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "intents", "admins",
                                                     {"status": {"phase": "Pending", "message": "deciding"}})
    patch(controller, "admins", {"labels": {"corral.dev/seen": "yes"}})
    # The trace an Intent was created in never changes, not even by its requester or an admin.
    for who in (admin, controller):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            patch(who, "admins", {"annotations": {"corral.dev/traceparent": agents_trace}})
        expected = f'corral.dev/traceparent is the trace the Intent was created in and cannot change (it was "{admins_trace}")'
        assert expected in _refusal(refused.value)


def test_a_grant_must_say_which_devices_and_values_it_covers(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str
) -> None:
    """The attack: `selector: {}` and no values was accepted and covered a high-risk lock Intent."""
    alice = kubernetes.client.CustomObjectsApi(api_client(plane, impersonate="alice", group="system:masters"))

    def grant(name: str, **bounds: Any) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ApprovalGrant", "metadata": {"name": name},
                "spec": {"grantor": "alice", "requester": "system:serviceaccount:home:agent", "actuators": ["locked"],
                         "uses": 3, "expiresAt": "2030-01-01T00:00:00Z", **bounds}}
        return alice.create_namespaced_custom_object(GROUP, VERSION, namespace, "approvalgrants", body)

    refusals = {  # the attack itself, each half of it, and what the refusal says (by the CRD, or a policy)
        "a grant must say which Devices it covers": ({"selector": {}}, 422),
        "an empty selector ({}) selects nothing": ({"selector": {}, "values": [True]}, 422),
        "a grant must say which values it covers": ({"devices": ["front-door-lock"]}, 403),
    }
    for expected, (bounds, code) in refusals.items():
        with pytest.raises(kubernetes.client.ApiException) as refused:
            grant("unbounded", **bounds)
        assert (refused.value.status, expected in yaml.safe_load(refused.value.body)["message"]) == (code, True)
    # Positive controls: a selector that says something and listed values, or named Devices and a range.
    assert grant("by-label", selector={"matchLabels": {"room": "hall"}}, values=[True])["spec"]["values"] == [True]
    grant("by-name", devices=["front-door-lock"], range={"minimum": 0, "maximum": 1})
