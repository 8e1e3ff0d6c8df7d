"""Standing grants end to end: a person grants in advance and in bounds; uses are consumed atomically, audited,
and revoking stops them at once. Real API server, real broker, a simulated air conditioner.

The air conditioner's set-point is low risk in its contract; the controller's risk floor raises it to medium
here, so every change needs a person's approval unless a grant covers it.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import FINAL_PHASES, GROUP, PEOPLE_NAMESPACE, VERSION
from corral.audit.log import read_records
from corral.client.intents import submit
from corral.devcluster.plane import Plane
from tests.controller_harness import CORRAL, ControllerProcess, device
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import kubeconfig_for
from tests.harness import apply_yaml, grant, person_name, service_account_token, wait_for

pytestmark = pytest.mark.integration

GRANTOR_RULES = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: grantor}}
rules: [{{apiGroups: [corral.dev], resources: [approvalgrants], verbs: [create, get, list, delete]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: grantor}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: grantor}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {people}}}]
"""


@dataclass
class Bedroom:
    namespace: str
    agent: kubernetes.client.ApiClient
    agent_name: str
    admin: kubernetes.client.ApiClient
    grantor_kubeconfig: Path
    controller: ControllerProcess
    fleet: Any

    def corral(self, *args: str) -> str:
        done = subprocess.run([CORRAL, *args, "-n", self.namespace], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "KUBECONFIG": str(self.grantor_kubeconfig)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    def ask(self, value: float) -> str:
        name = f"ac-{uuid.uuid4().hex[:8]}"
        spec = {"device": "bedroom-ac", "actuator": "target_temp", "action": "set_value", "params": {"value": value},
                "reason": "comfort", "requester": self.agent_name}
        assert submit(self.agent, self.namespace, name, spec).code == "CREATED"
        return name

    def settled(self, name: str) -> dict[str, Any]:
        """The Intent once it is final or waits for a person."""
        def now() -> dict[str, Any] | None:
            intent = kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "intents", name)
            phase = (intent.get("status") or {}).get("phase")
            return intent if phase in FINAL_PHASES or phase == "AwaitingApproval" else None
        return wait_for(now, f"Intent {name} to settle", timeout_s=30)

    def grant_status(self, name: str) -> dict[str, Any]:
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "approvalgrants", name).get("status") or {}


@pytest.fixture
def bedroom(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[Bedroom]:
    prefix = f"grt-{uuid.uuid4().hex[:8]}"
    agent = grant(plane, corral_api, namespace, "agent", "[get, list, read, write]", "[get]", "write")
    grant(plane, corral_api, namespace, "parent", "[get, list, read, approve]", "[get, list, create]", "approve",
          person=True)
    account = person_name(namespace, "parent")
    apply_yaml(corral_api, GRANTOR_RULES.format(account=account, people=PEOPLE_NAMESPACE), namespace)
    kubeconfig = kubeconfig_for(plane, service_account_token(corral_api, PEOPLE_NAMESPACE, account),
                                tmp_path / "parent.kubeconfig", namespace)
    with running_fleet(plane, prefix, {"bedroom-ac": "thermostat"}, enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log",
                                       "--risk-floor", "corral-ac/target_temp=medium", "--approval-window", "60")
        controller.start()
        try:
            wait_for(lambda: (device(corral_api, namespace, "bedroom-ac").get("status") or {}).get("inSync"),
                     "the air conditioner registered", timeout_s=30)
            yield Bedroom(namespace, agent, f"system:serviceaccount:{namespace}:agent", corral_api, kubeconfig,
                          controller, fleet)
        finally:
            controller.stop()


def test_a_grant_lets_exactly_its_uses_run_without_approval_and_a_revoked_one_none(bedroom: Bedroom) -> None:
    bedroom.corral("grants", "create", bedroom.agent_name, "--name", "cool-nights", "--device", "bedroom-ac",
                   "--actuator", "target_temp", "--range", "18..24", "--uses", "3", "--expires-in", "1h",
                   "--reason", "nights are hot")
    # Five at once, all inside the grant: the uses are consumed atomically, so exactly three run.
    names = [bedroom.ask(value) for value in (19, 20, 21, 22, 23)]
    outcomes = {name: bedroom.settled(name)["status"] for name in names}
    executed = sorted(n for n, s in outcomes.items() if s.get("code") == "EXECUTED")
    waiting = sorted(n for n, s in outcomes.items() if s.get("phase") == "AwaitingApproval")
    assert (len(executed), len(waiting)) == (3, 2), outcomes
    assert all(outcomes[n].get("grant") == "cool-nights" and not outcomes[n].get("approval") for n in executed)
    status = bedroom.grant_status("cool-nights")
    assert status["used"] == 3 and sorted(u["intent"] for u in status["consumedBy"]) == executed
    applied = [v for a, v in hardware_applies(bedroom.fleet, "bedroom-ac") if a == "target_temp"]
    assert len(applied) == 3
    # Outside the range: it waits for a person, like any other request.
    assert bedroom.settled(bedroom.ask(25))["status"]["phase"] == "AwaitingApproval"

    # A second grant runs one Intent, then is revoked: the next one waits.
    bedroom.corral("grants", "create", bedroom.agent_name, "--name", "warm-mornings", "--device", "bedroom-ac",
                   "--actuator", "target_temp", "--value", "26", "--value", "27", "--uses", "10")
    assert bedroom.settled(bedroom.ask(26))["status"].get("code") == "EXECUTED"
    assert "revoked" in bedroom.corral("grants", "revoke", "warm-mornings")
    after = bedroom.settled(bedroom.ask(27))["status"]
    assert after["phase"] == "AwaitingApproval", after
    # The two that waited still wait: nothing ran without a person.
    assert all(bedroom.settled(n)["status"]["phase"] == "AwaitingApproval" for n in waiting)
    def uses() -> list[str]:
        return sorted(r.subject for r in read_records(bedroom.controller.audit_dir) if r.kind == "grant.used")
    ns = bedroom.namespace
    wait_for(lambda: uses() == [f"{ns}/cool-nights"] * 3 + [f"{ns}/warm-mornings"], "each use on record")
