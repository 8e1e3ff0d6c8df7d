"""The gateway's own audit log (issue 16): what it refused never became an Intent, so it keeps a chained
log of its own, and publishes its checkpoints with the one Kubernetes right it holds."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import kubernetes
import pytest
import yaml
from click.testing import CliRunner

from corral.api.codes import GROUP, VERSION
from corral.audit.log import read_records
from corral.cli.main import cli
from corral.devcluster.plane import Plane
from tests.controller_harness import device, running_controller
from tests.fleet_harness import running_fleet
from tests.gateway_harness import HttpGateway, capabilities_readable, grant_agent, http_client
from tests.harness import api_client, apply_yaml, service_account_token, wait_for

pytestmark = pytest.mark.integration

# What the chart grants the gateway's ServiceAccount, and nothing else.
GATEWAY_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: corral-gateway-checkpoint}}
rules:
- {{apiGroups: [corral.dev], resources: [auditcheckpoints], resourceNames: [corral-gateway], verbs: [get, update]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: corral-gateway-checkpoint}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: corral-gateway-checkpoint}}
subjects: [{{kind: ServiceAccount, name: corral-gateway, namespace: {namespace}}}]
"""


def kubeconfig_with(plane: Plane, token: str, path: Path) -> Path:
    config = yaml.safe_load(plane.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_gateway_keeps_its_refusals_in_a_chained_log_and_may_update_only_its_own_checkpoint(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    for name in ("corral-gateway", "corral-controller"):  # the chart creates both
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "auditcheckpoints", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "AuditCheckpoint", "metadata": {"name": name}})
    apply_yaml(corral_api, GATEWAY_ROLE.format(namespace=namespace), namespace)
    gateway_token = service_account_token(corral_api, namespace, "corral-gateway")
    agent = grant_agent(plane, corral_api, namespace)
    audit_dir = tmp_path / "gateway-audit"
    prefix = f"gwa-{uuid.uuid4().hex[:6]}"
    with running_fleet(plane, prefix, {"desk-lamp": "light"}, enroll_in=(corral_api, namespace)), \
            running_controller(plane, namespace, prefix, tmp_path), capabilities_readable(corral_api, namespace, "agent"):
        wait_for(lambda: (device(corral_api, namespace, "desk-lamp").get("status") or {}).get("inSync"),
                 "the lamp registered", timeout_s=60)
        refusals_on_record(plane, namespace, agent, gateway_token, audit_dir, tmp_path)
    check_record(plane, corral_api, namespace, audit_dir, tmp_path)


def refusals_on_record(plane: Plane, namespace: str, agent: str, gateway_token: str, audit_dir: Path,
                       tmp_path: Path) -> None:
    objects = kubernetes.client.CustomObjectsApi(api_client(plane))
    gateway = HttpGateway(plane, namespace, tmp_path / "gateway.log", "--audit-dir", str(audit_dir),
                          "--audit-checkpoint", f"{namespace}/corral-gateway", "--audit-checkpoint-interval", "1",
                          kubeconfig=kubeconfig_with(plane, gateway_token, tmp_path / "gateway.kubeconfig"))

    async def refused_calls() -> None:
        async with http_client(gateway.url, agent) as client:
            with pytest.raises(Exception, match="Unknown tool"):
                await client.call_tool("iot.open_all_doors", {})
            hidden = await client.call_tool("iot.query", {"device_id": f"{namespace}/front-door"})
            assert hidden.is_error
            outside = await client.call_tool("iot.control", {
                "device_id": f"{namespace}/desk-lamp", "actuator": "brightness", "action": "set_value",
                "params": {"value": 500}, "reason": "brighter than bright", "request_id": "r-1"})
            assert outside.is_error

    try:
        asyncio.run(asyncio.wait_for(refused_calls(), 60))
        wait_for(lambda: len([r for r in read_records(audit_dir) if r.kind == "gateway.refused"]) == 3,
                 "the refusals on record", timeout_s=15)
        wait_for(lambda: (objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "auditcheckpoints",
                                                               "corral-gateway").get("spec") or {}).get("seq", 0) >= 3,
                 "a checkpoint covering them published", timeout_s=15)
    finally:
        gateway.stop()


def check_record(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, audit_dir: Path,
                 tmp_path: Path) -> None:
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    refusals = [r for r in read_records(audit_dir) if r.kind == "gateway.refused"]
    assert [r.data["code"] for r in refusals] == ["DENY_UNKNOWN_ACTION", "DEVICE_GONE", "DENY_ARGUMENTS"]
    assert all(r.subject == f"system:serviceaccount:{namespace}:agent" for r in refusals)
    assert "front-door" in refusals[1].data["arguments"] and "No device" in refusals[1].data["message"]
    assert "500" in refusals[2].data["arguments"], refusals[2].data
    done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(audit_dir), "--key",
                                    str(audit_dir / "gateway.pub.pem"), "--checkpoint-object",
                                    f"{namespace}/corral-gateway"], env={"KUBECONFIG": str(plane.kubeconfig)})
    assert done.exit_code == 0, done.output
    # The final checkpoint, written as the gateway stopped, is what the object holds now.
    spec = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "auditcheckpoints", "corral-gateway")["spec"]
    assert spec["final"] is True
    # Its one right: not the controller's checkpoint, not a new object, nothing else.
    as_gateway = kubernetes.client.CustomObjectsApi(
        kubernetes.config.new_client_from_config(config_file=str(tmp_path / "gateway.kubeconfig")))
    for attempt in (
        lambda: as_gateway.get_namespaced_custom_object(GROUP, VERSION, namespace, "auditcheckpoints",
                                                        "corral-controller"),
        lambda: as_gateway.list_namespaced_custom_object(GROUP, VERSION, namespace, "devices"),
        lambda: as_gateway.create_namespaced_custom_object(GROUP, VERSION, namespace, "auditcheckpoints", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "AuditCheckpoint", "metadata": {"name": "forged"}}),
    ):
        with pytest.raises(kubernetes.client.ApiException) as refused:
            attempt()
        assert refused.value.status == 403
