"""Who wrote a Rule's revision, and when, as the API server vouches for it (issue 41, findings 10 and 11): real API
server (its admission policies and RBAC authorizer), real broker, the controller and simulated devices.

10: a Rule edit's time was read from its managedFields, which the writer may overwrite: an agent that backdated its
edit kept the standing grants to the Rule's ServiceAccount that the edit should void. The time is now when the
controller saw the edit.
11: a Rule whose author's rights come from a group (a RoleBinding to a Group) never fired: the controller reviewed
the author with the groups the username implies. The author's groups are recorded at admission (spec.authorGroups,
which must equal the writer's own) and reviewed with.

Identities: `carol`, a person whose every right comes from the group `household` (impersonation with a group, as an
identity provider's group would be); `agent`, the chart's agent-operator and agent-rule-writer roles.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.roles import USER_ROLE_RULES
from corral.api.rule import RULE_LABEL, Rule
from corral.audit.log import AuditLog, read_records
from corral.client.intents import identity
from corral.decide.revisions import REVISED
from corral.devcluster.plane import Plane
from corral.kube.objects import Kube
from corral.reconcile.rules.revisions import Revisions
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import hardware_applies, on_fleet, running_fleet
from tests.harness import api_client, apply_yaml, fresh_namespace, service_account_token, wait_for, wait_until_allowed

pytestmark = pytest.mark.integration

RULE_SA, LAMP, PROBE = "porch-rule", "hall-lamp", "hall-probe"
BACKDATED = "2000-01-01T00:00:00Z"
FORGED_GROUPS = "spec.authorGroups must be exactly the groups you are authenticated with"
HOUSEHOLD_RULES = [
    {"apiGroups": [GROUP], "resources": ["rules"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
    {"apiGroups": [GROUP], "resources": ["devices"], "verbs": ["get", "list", "read", "write", "approve"]},
    {"apiGroups": [GROUP], "resources": ["approvalgrants"], "verbs": ["get", "list", "create"]},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": [RULE_SA], "verbs": ["use"]}]
ACTING_RULES = [{"apiGroups": [GROUP], "resources": ["devices"], "verbs": ["get", "list", "read", "write"]},
                {"apiGroups": [GROUP], "resources": ["intents"], "verbs": ["get", "list", "watch", "create"]}]
USE_RULE_SA = [{"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": [RULE_SA], "verbs": ["use"]}]


def _bound(name: str, rules: list[dict[str, Any]], subject: dict[str, str]) -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [subject]}]


@dataclass
class Household:
    plane: Plane
    namespace: str
    admin: kubernetes.client.ApiClient
    carol: kubernetes.client.ApiClient  # rights only through the group "household"
    agent: kubernetes.client.ApiClient

    @property
    def agent_username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:agent"

    @property
    def rule_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{RULE_SA}"

    def objects(self, client: kubernetes.client.ApiClient | None = None) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(client or self.admin)

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return self.objects().get_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)


def household_in(plane: Plane, admin: kubernetes.client.ApiClient, namespace: str) -> Household:
    """The roles of the module's identities in `namespace`, once the authorizer has them."""
    core = kubernetes.client.CoreV1Api(admin)
    for account in (RULE_SA, "agent"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    agent_sa = {"kind": "ServiceAccount", "name": "agent", "namespace": namespace}
    apply_yaml(admin, yaml.safe_dump_all([
        *_bound("household", HOUSEHOLD_RULES, {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                               "name": "household"}),
        *_bound("acting", ACTING_RULES, {"kind": "ServiceAccount", "name": RULE_SA, "namespace": namespace}),
        *_bound("agent-operator", USER_ROLE_RULES["agent-operator"], agent_sa),
        *_bound("agent-rule-writer", USER_ROLE_RULES["agent-rule-writer"], agent_sa),
        *_bound("agent-uses-rule-sa", USE_RULE_SA, agent_sa)]), namespace)
    carol = api_client(plane, impersonate="carol", group="household")
    agent = api_client(plane, token=service_account_token(admin, namespace, "agent"))
    for client in (carol, agent):
        wait_until_allowed(client, "create", namespace, "rules")
        wait_for(lambda client=client: _may_use(client, namespace), f"the use of {RULE_SA}")
    return Household(plane, namespace, admin, carol, agent)


def _may_use(client: kubernetes.client.ApiClient, namespace: str) -> bool:
    review = kubernetes.client.AuthorizationV1Api(client).create_self_subject_access_review({"spec": {
        "resourceAttributes": {"resource": "serviceaccounts", "verb": "use", "namespace": namespace, "name": RULE_SA}}})
    return bool(review.status.allowed)


def rule_body(name: str, author: str, *, groups: list[str] | None = None, action: dict[str, Any] | None = None,
              inputs: tuple[str, ...] = (PROBE,)) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Rule", "metadata": {"name": name}, "spec": {
        "serviceAccountName": RULE_SA, "author": author, **({"authorGroups": groups} if groups is not None else {}),
        "inputs": list(inputs), "condition": f'readings["{PROBE}"]["wet"]', "for": "0s", "cooldown": "10m",
        "maxReadingAgeSeconds": 5, "reason": "light the hall when water is on the floor",
        "actions": [action or {"device": LAMP, "actuator": "power", "action": "set_state", "value": True}]}}


def grant_body(household: Household, name: str, requester: str) -> dict[str, Any]:
    expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": API_VERSION, "kind": "ApprovalGrant", "metadata": {"name": name},
            "spec": {"grantor": "carol", "grantorGroups": list(identity(household.carol).groups),
                     "requester": requester, "devices": [LAMP], "actuators": ["power"], "values": [True], "uses": 5,
                     "expiresAt": expires}}


# ---- 10: a backdated edit still voids the standing grant -----------------------------------------------------------

def test_a_rule_edit_with_backdated_managed_fields_still_voids_the_standing_grant(
        plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path: Path) -> None:
    # A namespace of its own: no controller watches it, so the revision is observed exactly when the test says.
    with fresh_namespace(corral_api, "rule-edit-times") as namespace:
        home = household_in(plane, corral_api, namespace)
        carols = home.objects(home.carol)
        for name, requester in (("standing", home.rule_account), ("for-the-agent", home.agent_username)):
            carols.create_namespaced_custom_object(GROUP, VERSION, namespace, "approvalgrants",
                                                   grant_body(home, name, requester))
        agents = home.objects(home.agent)
        agents.create_namespaced_custom_object(GROUP, VERSION, namespace, "rules", rule_body("dusk", home.agent_username))
        agents.patch_namespaced_custom_object(GROUP, VERSION, namespace, "rules", "dusk", {"spec": {"cooldown": "1m"}})
        # The attack: the agent dates its edit before every grant, in a write of managedFields alone, the entries
        # named for another manager (the API server stamps the time of the writing client's own entry, no other).
        fields = home.get("rules", "dusk")["metadata"]["managedFields"]
        agents.patch_namespaced_custom_object(GROUP, VERSION, namespace, "rules", "dusk", {"metadata": {
            "managedFields": [{**entry, "time": BACKDATED, "manager": "kubectl-edit"} for entry in fields]}})
        edited = home.get("rules", "dusk")
        assert edited["metadata"]["generation"] == 2
        assert {e.get("time") for e in edited["metadata"]["managedFields"]} == {BACKDATED}, "the backdating stands"

        # The controller sees the edit; then (next second) carol grants again, knowingly, for the new revision.
        seen = datetime.now(UTC)
        wait_for(lambda: datetime.now(UTC).replace(microsecond=0) > seen.replace(microsecond=0), "the next second")
        carols.create_namespaced_custom_object(GROUP, VERSION, namespace, "approvalgrants",
                                               grant_body(home, "after-the-edit", home.rule_account))
        cited = asyncio.run(_observe(home, Rule.model_validate(edited), tmp_path / "audit", seen))
        (record,) = [r for r in read_records(tmp_path / "audit") if r.kind == REVISED]
        assert record.seq == cited.seq and record.data["voidedGrants"] == ["standing"], record.data

        def voided(name: str) -> dict[str, Any] | None:
            return (home.get("approvalgrants", name).get("status") or {}).get("voided")
        assert (voided("standing") or {}).get("generation") == 2
        # Positive controls: a grant to someone else, and the one a person made after the edit was seen, stand.
        assert voided("for-the-agent") is None and voided("after-the-edit") is None


async def _observe(home: Household, rule: Rule, audit_dir: Path, seen: datetime) -> Any:
    """The controller's own revision hook, on its own audit log, with the time it saw the edit."""
    kube = Kube(home.admin.configuration)
    audit = AuditLog(audit_dir, "controller", Ed25519PrivateKey.generate())
    audit.open()
    try:
        return await Revisions(kube, audit, clock=lambda: seen).observe(rule)
    finally:
        await audit.flush()
        audit.close()
        await kube.close()


# ---- 11: an author whose rights come from a group ------------------------------------------------------------------

@dataclass
class Hall:
    home: Household
    fleet: Any
    controller: ControllerProcess


@pytest.fixture(scope="module")
def hall(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Hall]:
    """A lamp and a leak probe, and the controller, in a namespace where carol's rights come from her group."""
    with fresh_namespace(corral_api, "rule-authors") as namespace:
        home = household_in(plane, corral_api, namespace)
        prefix = f"auth-{uuid.uuid4().hex[:8]}"
        with running_fleet(plane, prefix, {LAMP: "light", PROBE: "leak_probe"}, enroll_in=(corral_api, namespace),
                           telemetry_interval_s=0.5) as fleet:
            controller = ControllerProcess(plane, namespace, prefix,
                                           tmp_path_factory.mktemp("rule-authors") / "controller.log",
                                           "--status-interval", "1")
            controller.start()
            try:
                wait_for(lambda: all((device(corral_api, namespace, d).get("status") or {}).get("inSync")
                                     for d in (LAMP, PROBE)), "both devices registered and in sync", timeout_s=30)
                yield Hall(home, fleet, controller)
            finally:
                controller.stop()


def test_a_rule_by_a_person_whose_rights_come_from_a_group_fires_and_forged_groups_are_refused(hall: Hall) -> None:
    home, name = hall.home, f"flood-{uuid.uuid4().hex[:6]}"
    carols = home.objects(home.carol)
    me = identity(home.carol)
    assert me.username == "carol" and "household" in me.groups, me

    # Claiming a group she is not in is refused by the API server, saying which groups she has.
    with pytest.raises(kubernetes.client.ApiException) as forged:
        carols.create_namespaced_custom_object(GROUP, VERSION, home.namespace, "rules", rule_body(
            name, "carol", groups=[*me.groups, "corral-admins"]))
    said = str(json.loads(forged.value.body)["message"])
    assert forged.value.status == 403 and FORGED_GROUPS in said and "corral-admins" in said, said

    on_fleet(hall.fleet, lambda: hall.fleet.set_sensor(PROBE, "wet", True))

    def status() -> dict[str, Any]:
        return home.get("rules", name).get("status") or {}

    # Written without her groups, as before: admission lets her write it, but the controller counts only what her
    # name implies, so the Rule does not fire and says why.
    carols.create_namespaced_custom_object(GROUP, VERSION, home.namespace, "rules", rule_body(name, "carol"))
    refused = wait_for(lambda: (s := status()).get("state") == "Refused" and s, "the Rule refused for its author",
                       timeout_s=20)
    assert "its author carol may not" in refused["message"], refused
    assert ("power", True) not in hardware_applies(hall.fleet, LAMP)

    # With the groups admission vouches for, the same person's Rule fires.
    carols.patch_namespaced_custom_object(GROUP, VERSION, home.namespace, "rules", name,
                                          {"spec": {"authorGroups": list(me.groups)}})
    assert home.get("rules", name)["spec"]["authorGroups"] == list(me.groups)

    def executed() -> dict[str, Any] | None:
        made = home.objects().list_namespaced_custom_object(GROUP, VERSION, home.namespace, "intents",
                                                             label_selector=f"{RULE_LABEL}={name}")["items"]
        return next((i for i in made if (i.get("status") or {}).get("code") == "EXECUTED"), None)
    intent = wait_for(executed, "the Rule's Intent EXECUTED", timeout_s=30)
    assert intent["spec"]["requester"] == home.rule_account
    wait_for(lambda: ("power", True) in hardware_applies(hall.fleet, LAMP), "the lamp on", timeout_s=15)
    records = [r.data for r in read_records(hall.controller.audit_dir) if r.kind == REVISED and r.data["rule"] == name]
    assert [r["generation"] for r in records] == [1, 2] and all(r["authorIsPerson"] for r in records), records
