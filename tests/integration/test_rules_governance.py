"""Who may write a Rule, agents editing Rules through the gateway, revisions, acceptance and grant voiding, against
the real API server (its admission policies and RBAC authorizer) and the gateway over stdio.

Identities: `agent` (the chart's agent-operator and agent-rule-writer roles, and `use` on the ServiceAccount
`porch-rule` only), `parent` (a person: the chart's approver role, and write on devices), and two ServiceAccounts a
Rule may name: `porch-rule` (weak) and `master` (stronger, which the agent may not use).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.api.codes import API_VERSION, GROUP, PEOPLE_NAMESPACE, VERSION
from corral.api.roles import USER_ROLE_RULES
from corral.api.rule import ACCEPTED_ANNOTATION, PREVIOUS_SPEC_ANNOTATION, RULE_LABEL, Rule, RuleSpec
from corral.audit.log import AuditLog, read_records
from corral.cli import rule_review
from corral.cli.main import cli
from corral.decide.revisions import REVISED, kept_annotation, spec_hash
from corral.devcluster.plane import Plane
from corral.kube.objects import Kube
from corral.reconcile.rules.revisions import Revisions
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import hardware_applies, on_fleet, running_fleet
from tests.gateway_harness import gateway_token, kubeconfig_for, stdio_client
from tests.harness import (
    api_client,
    apply_yaml,
    ensure_people_namespace,
    fresh_namespace,
    person_name,
    person_user,
    service_account_token,
    wait_for,
    wait_until_allowed,
)

pytestmark = pytest.mark.integration

CONDITION = 'readings["porch-sensor"]["lux"] < 10.0'


@dataclass
class Governed:
    plane: Plane
    namespace: str
    admin: kubernetes.client.ApiClient
    agent: kubernetes.client.ApiClient
    agent_kubeconfig: Path
    person: kubernetes.client.ApiClient
    person_kubeconfig: Path

    @property
    def agent_username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:agent"

    @property
    def person_username(self) -> str:
        return person_user(self.namespace, "parent")

    def corral(self, *args: str) -> str:
        """`corral ARGS -n NS` as the person (in this process: the command, without a second interpreter's start)."""
        done = CliRunner().invoke(cli, [*args, "-n", self.namespace, "--kubeconfig", str(self.person_kubeconfig)])
        assert done.exit_code == 0, (done.stdout, done.stderr, done.exception)
        return done.stdout

    def refused(self, *args: str, typed: str | None = None) -> str:
        """`corral ARGS -n NS` as the person, which must fail; what it said. `typed`: a person at a terminal (stdin a
        TTY) who types this."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rule_review, "interactive", lambda: typed is not None)
            done = CliRunner().invoke(cli, [*args, "-n", self.namespace, "--kubeconfig", str(self.person_kubeconfig)],
                                      input=typed)
        assert done.exit_code != 0, done.output
        return done.output

    def typing(self, typed: str, *args: str) -> str:
        """`corral ARGS -n NS` as a person at a terminal who types `typed` when asked."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rule_review, "interactive", lambda: True)
            done = CliRunner().invoke(cli, [*args, "-n", self.namespace, "--kubeconfig", str(self.person_kubeconfig)],
                                      input=typed)
        assert done.exit_code == 0, (done.output, done.exception)
        return done.output

    def rule(self, name: str) -> dict[str, Any]:
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "rules", name)


def _role(name: str, rules: list[dict[str, Any]], subject: dict[str, str]) -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [subject]}]


def rule_body(name: str, author: str, service_account: str = "porch-rule", level: int = 80) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Rule", "metadata": {"name": name}, "spec": {
        "serviceAccountName": service_account, "author": author, "inputs": ["porch-sensor"], "condition": CONDITION,
        "for": "2s", "cooldown": "10m", "reason": "light the porch when it gets dark",
        "actions": [{"device": "porch-light", "actuator": "brightness", "action": "set_value", "value": level}]}}


def _may_use(client: kubernetes.client.ApiClient, namespace: str, account: str) -> bool:
    review = kubernetes.client.AuthorizationV1Api(client).create_self_subject_access_review({"spec": {
        "resourceAttributes": {"resource": "serviceaccounts", "verb": "use", "namespace": namespace,
                               "name": account}}})
    return bool(review.status.allowed)


def _writer_policy_enforced(agent: kubernetes.client.ApiClient, namespace: str) -> bool:
    """The Rule policy is loaded once a forged author is refused by it (a dry run writes nothing)."""
    try:
        kubernetes.client.CustomObjectsApi(agent).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "rules", rule_body("probe", "somebody-else"), dry_run="All")
    except kubernetes.client.ApiException as err:
        return err.status == 403 and "corral-rule-writer" in str(err.body)
    return False


@pytest.fixture(scope="module")
def governed(plane: Plane, corral_api: kubernetes.client.ApiClient,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Governed]:
    tmp = tmp_path_factory.mktemp("rules-governance")
    with fresh_namespace(corral_api, "rules-governance") as namespace:
        core = kubernetes.client.CoreV1Api(corral_api)
        for account in ("porch-rule", "master"):
            core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
        agent_sa = {"kind": "ServiceAccount", "name": "agent", "namespace": namespace}
        ensure_people_namespace(corral_api)
        person_sa = {"kind": "ServiceAccount", "name": person_name(namespace, "parent"), "namespace": PEOPLE_NAMESPACE}
        use_porch = [{"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["porch-rule"],
                      "verbs": ["use"]}]
        objects = [*_role("agent-operator", USER_ROLE_RULES["agent-operator"], agent_sa),
                   *_role("agent-rule-writer", USER_ROLE_RULES["agent-rule-writer"], agent_sa),
                   *_role("agent-uses-porch-rule", use_porch, agent_sa),
                   *_role("approver", USER_ROLE_RULES["approver"], person_sa),
                   *_role("parent-writes", [{"apiGroups": [GROUP], "resources": ["devices"],
                                             "verbs": ["get", "list", "read", "write"]},
                                            {"apiGroups": [""], "resources": ["serviceaccounts"],
                                             "verbs": ["use"]}], person_sa)]
        apply_yaml(corral_api, yaml.safe_dump_all(objects), namespace)
        agent_token = gateway_token(corral_api, namespace, "agent")
        agent = api_client(plane, token=agent_token)
        person_token = service_account_token(corral_api, PEOPLE_NAMESPACE, person_name(namespace, "parent"))
        person = api_client(plane, token=person_token)
        wait_until_allowed(agent, "create", namespace, "rules")
        wait_for(lambda: _may_use(agent, namespace, "porch-rule"), "the agent's use of porch-rule")
        wait_until_allowed(person, "approve", namespace, "rules")
        wait_for(lambda: _writer_policy_enforced(agent, namespace), "the Rule admission policy to take effect",
                 timeout_s=30)
        yield Governed(plane, namespace, corral_api, agent,
                       kubeconfig_for(plane, agent_token, tmp / "agent.kubeconfig", namespace), person,
                       kubeconfig_for(plane, person_token, tmp / "parent.kubeconfig", namespace))


def _refused(client: kubernetes.client.ApiClient, namespace: str, call: str, *args: Any) -> str:
    objects = kubernetes.client.CustomObjectsApi(client)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        getattr(objects, call)(GROUP, VERSION, namespace, "rules", *args)
    assert refused.value.status == 403, refused.value.body
    return str(json.loads(refused.value.body)["message"])


def test_the_api_server_refuses_a_rule_that_would_lend_its_writer_more_than_it_holds(governed: Governed) -> None:
    ns, agent = governed.namespace, governed.agent
    said = _refused(agent, ns, "create_namespaced_custom_object", rule_body("forged", "system:serviceaccount:x:y"))
    assert "spec.author must be your own username" in said and governed.agent_username in said, said
    said = _refused(agent, ns, "create_namespaced_custom_object",
                    rule_body("stronger", governed.agent_username, service_account="master"))
    assert "may not name ServiceAccount master" in said and "impersonate or use verb" in said, said

    made = kubernetes.client.CustomObjectsApi(agent).create_namespaced_custom_object(
        GROUP, VERSION, ns, "rules", rule_body("evening", governed.agent_username))
    # An agent's edit that names the stronger ServiceAccount: refused, and the Rule is as it was.
    stronger = {**made, "spec": {**made["spec"], "serviceAccountName": "master"}}
    said = _refused(agent, ns, "replace_namespaced_custom_object", "evening", stronger)
    assert "may not name ServiceAccount master" in said, said
    assert governed.rule("evening")["spec"]["serviceAccountName"] == "porch-rule"

    # Accepting: not by an agent (no approve verb), and only exactly "<this generation>:<yourself>".
    own = {"metadata": {"annotations": {ACCEPTED_ANNOTATION: f"1:{governed.agent_username}"}}}
    said = _refused(agent, ns, "patch_namespaced_custom_object", "evening", own)
    assert "needs the approve verb on rules/evening" in said, said
    wrong = {"metadata": {"annotations": {ACCEPTED_ANNOTATION: f"2:{governed.person_username}"}}}
    said = _refused(governed.person, ns, "patch_namespaced_custom_object", "evening", wrong)
    assert f'must be exactly "1:{governed.person_username}"' in said, said
    right = {"metadata": {"annotations": {ACCEPTED_ANNOTATION: f"1:{governed.person_username}"}}}
    kubernetes.client.CustomObjectsApi(governed.person).patch_namespaced_custom_object(
        GROUP, VERSION, ns, "rules", "evening", right)
    annotations = governed.rule("evening")["metadata"]["annotations"]
    assert annotations[ACCEPTED_ANNOTATION] == f"1:{governed.person_username}"
    # (corral rules accept, which shows the revision and binds the acceptance to it: see the tests with the
    # controller below, which records the revisions it binds to.)


def test_an_agent_edits_a_rule_through_the_gateway_and_the_previous_revision_is_kept(governed: Governed) -> None:
    started = time.monotonic()
    name = f"porch-{uuid.uuid4().hex[:6]}"
    put: dict[str, Any] = {
        "name": name, "service_account": "porch-rule", "inputs": ["porch-sensor"], "condition": CONDITION, "for_s": 2,
        "cooldown_s": 600, "reason": "light the porch when it gets dark",
        "actions": [{"device": "porch-light", "actuator": "brightness", "action": "set_value", "value": 80}]}

    async def session() -> tuple[list[str], list[Any]]:
        async with stdio_client(governed.agent_kubeconfig) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            answers = [await client.call_tool("iot.rules.put", put),
                       await client.call_tool("iot.rules.put", {**put, "actions": [
                           {**put["actions"][0], "value": 100}], "reason": "brighter"}),
                       await client.call_tool("iot.rules.get", {"name": name}),
                       await client.call_tool("iot.rules.put", {**put, "service_account": "master"}),
                       await client.call_tool("iot.rules.list", {})]
            return tools, answers

    tools, (created, edited, got, stronger, listed) = asyncio.run(asyncio.wait_for(session(), 60))
    assert {"iot.rules.list", "iot.rules.get", "iot.rules.put", "iot.rules.restore"} <= set(tools), tools
    for answer in (created, edited, got, listed):
        assert not answer.is_error, answer.content
    first, second = created.structured_content, edited.structured_content
    assert first["generation"] == 1 and first["acts"] is False and "corral rules accept" in first["message"], first
    assert second["generation"] == 2 and second["previous_kept"] is True, second
    assert got.structured_content["previous_kept"] is True
    assert got.structured_content["spec"]["actions"][0]["value"] == 100
    # Refused by the API server's admission policy, said as such; nothing changed.
    assert stronger.is_error and stronger.structured_content["code"] == "DENY_SCOPE", stronger.structured_content
    assert "may not name ServiceAccount master" in stronger.structured_content["message"]
    stored = governed.rule(name)
    assert stored["spec"]["actions"][0]["value"] == 100 and stored["spec"]["author"] == governed.agent_username
    kept = json.loads(stored["metadata"]["annotations"][PREVIOUS_SPEC_ANNOTATION])
    assert kept["actions"][0]["value"] == 80 and kept["reason"] == "light the porch when it gets dark"
    assert any(r["name"] == f"{governed.namespace}/{name}" and r["acts"] is False
               for r in listed.structured_content["rules"])

    # A person reads the diff against the kept revision (restoring it: with the controller, below).
    shown = governed.corral("rules", "show", name)
    assert "Changes against it" in shown and '+      "value": 100' in shown, shown

    # The Rules' own switch, written in the person's name.
    assert "Rules paused by" in governed.corral("rules", "pause", "--reason", "away for the week")
    switch = kubernetes.client.CustomObjectsApi(governed.admin).get_namespaced_custom_object(
        GROUP, VERSION, governed.namespace, "agentpauses", "rules")
    assert switch["spec"]["paused"] is True and switch["spec"]["by"] == governed.person_username
    governed.corral("rules", "resume")
    print(f"gateway edits: {time.monotonic() - started:.1f} s")


def test_an_edit_voids_the_grants_to_the_rules_service_account_until_a_person_renews_them(
        governed: Governed, tmp_path: Path) -> None:
    ns = governed.namespace
    objects = kubernetes.client.CustomObjectsApi(governed.person)
    rule_sa = f"system:serviceaccount:{ns}:porch-rule"
    expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def grant(name: str, requester: str) -> None:
        objects.create_namespaced_custom_object(GROUP, VERSION, ns, "approvalgrants", {
            "apiVersion": API_VERSION, "kind": "ApprovalGrant", "metadata": {"name": name},
            "spec": {"grantor": governed.person_username, "requester": requester, "devices": ["porch-light"],
                     "actuators": ["brightness"], "range": {"minimum": 0, "maximum": 100}, "uses": 5,
                     "expiresAt": expires, "reason": "dusk"}})

    grant("for-the-rule", rule_sa)
    grant("for-the-agent", governed.agent_username)
    kubernetes.client.CustomObjectsApi(governed.agent).create_namespaced_custom_object(
        GROUP, VERSION, ns, "rules", rule_body("dusk", governed.agent_username))
    kubernetes.client.CustomObjectsApi(governed.agent).patch_namespaced_custom_object(
        GROUP, VERSION, ns, "rules", "dusk", {"spec": {"actions": [
            {"device": "porch-light", "actuator": "brightness", "action": "set_value", "value": 100}]}})

    async def observe() -> tuple[Any, Any]:
        kube = Kube(governed.admin.configuration)
        audit = AuditLog(tmp_path / "audit", "controller", Ed25519PrivateKey.generate())
        audit.open()
        try:
            revisions = Revisions(kube, audit)
            first = Rule.model_validate(governed.rule("dusk"))
            return await revisions.observe(first), first
        finally:
            await audit.flush()
            audit.close()
            await kube.close()

    cited, rule = asyncio.run(observe())
    assert cited is not None
    records = [r for r in read_records(tmp_path / "audit") if r.kind == REVISED]
    assert len(records) == 1 and records[0].seq == cited.seq
    data = records[0].data
    assert data["generation"] == 2 and data["author"] == governed.agent_username and data["authorIsPerson"] is False
    assert data["specHash"] == spec_hash(rule.spec) and data["voidedGrants"] == ["for-the-rule"], data

    def status(name: str) -> dict[str, Any]:
        return objects.get_namespaced_custom_object(GROUP, VERSION, ns, "approvalgrants", name).get("status") or {}
    voided = status("for-the-rule")["voided"]
    assert voided["rule"] == "dusk" and voided["generation"] == 2 and voided["audit"]["seq"] == cited.seq
    assert "voided" not in status("for-the-agent")
    listed = governed.corral("grants", "list")
    assert "for-the-rule" in listed and "VOIDED by Rule dusk revision 2" in listed, listed
    renewed = governed.corral("grants", "renew", "for-the-rule")
    new_name = renewed.split(":", 1)[0]
    assert "5 more time(s)" in renewed and "for-the-rule revoked" in renewed, renewed
    assert "voided" not in status(new_name)


# ---- with the controller: acceptance, the agents' pause, the controller's records and voiding -------------------

VALVE, PROBE = "main-valve", "cellar-probe"
ACTING_ROLE = [{"apiGroups": [GROUP], "resources": ["devices"], "verbs": ["get", "list", "read", "write"]},
               {"apiGroups": [GROUP], "resources": ["intents"], "verbs": ["get", "list", "watch", "create"]}]


@dataclass
class Acting:
    fleet: Any
    controller: ControllerProcess


@pytest.fixture(scope="module")
def acting(plane: Plane, governed: Governed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Acting]:
    """A valve and a leak probe, and the controller, in the module's namespace; the Rule acts as porch-rule."""
    ns = governed.namespace
    apply_yaml(governed.admin, yaml.safe_dump_all(_role("acting", ACTING_ROLE, {
        "kind": "ServiceAccount", "name": "porch-rule", "namespace": ns})), ns)
    prefix = f"rgov-{uuid.uuid4().hex[:8]}"
    devices = {VALVE: "water_valve", PROBE: "leak_probe"}
    with running_fleet(plane, prefix, devices, enroll_in=(governed.admin, ns), telemetry_interval_s=0.5) as fleet:
        controller = ControllerProcess(plane, ns, prefix, tmp_path_factory.mktemp("rgov") / "controller.log",
                                       "--approvals", "medium=0", "--status-interval", "1")
        controller.start()
        try:
            wait_for(lambda: all((device(governed.admin, ns, d).get("status") or {}).get("inSync") for d in devices),
                     "every device registered and in sync", timeout_s=30)
            yield Acting(fleet, controller)
        finally:
            controller.stop()


def test_an_agents_rule_acts_only_once_a_person_accepts_it_and_not_while_agents_are_paused(
        governed: Governed, acting: Acting) -> None:
    started = time.monotonic()
    ns, name = governed.namespace, f"leak-{uuid.uuid4().hex[:6]}"
    objects = kubernetes.client.CustomObjectsApi(governed.agent)
    # A person's standing grant to the Rule's ServiceAccount, made well before the agent's edit below (seconds: the
    # pause and the acceptance come between; the API server's clocks count whole seconds).
    expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kubernetes.client.CustomObjectsApi(governed.person).create_namespaced_custom_object(
        GROUP, VERSION, ns, "approvalgrants", {
            "apiVersion": API_VERSION, "kind": "ApprovalGrant", "metadata": {"name": f"{name}-grant"},
            "spec": {"grantor": governed.person_username, "requester": f"system:serviceaccount:{ns}:porch-rule",
                     "devices": [VALVE], "actuators": ["open"], "values": [False], "uses": 3,
                     "expiresAt": expires}})
    on_fleet(acting.fleet, lambda: acting.fleet.set_sensor(PROBE, "wet", True))
    body = {"apiVersion": API_VERSION, "kind": "Rule", "metadata": {"name": name}, "spec": {
        "serviceAccountName": "porch-rule", "author": governed.agent_username, "inputs": [PROBE],
        "condition": f'readings["{PROBE}"]["wet"]', "for": "0s", "cooldown": "10m", "maxReadingAgeSeconds": 5,
        "reason": "shut the water off when the cellar floods",
        "actions": [{"device": VALVE, "actuator": "open", "action": "set_state", "value": False}]}}
    objects.create_namespaced_custom_object(GROUP, VERSION, ns, "rules", body)

    def state() -> str | None:
        return (governed.rule(name).get("status") or {}).get("state")

    def made() -> list[dict[str, Any]]:
        return list(kubernetes.client.CustomObjectsApi(governed.admin).list_namespaced_custom_object(
            GROUP, VERSION, ns, "intents", label_selector=f"{RULE_LABEL}={name}")["items"])

    # The probe is wet and the Rule's ServiceAccount may close the valve, but an agent wrote it: it waits.
    wait_for(lambda: state() == "AwaitingAcceptance", "the agent's Rule to wait for a person", timeout_s=15)
    assert made() == []
    # A person accepts it while agents are paused: an agent's Rule obeys the agents' pause.
    governed.corral("agents", "pause", "--reason", "checking the cellar")
    governed.corral("rules", "accept", name, "--generation", "1")
    wait_for(lambda: state() == "Paused", "the accepted Rule to be held by the agents' pause", timeout_s=15)
    assert made() == [] and (governed.rule(name)["status"].get("acceptedGeneration") == 1)
    governed.corral("agents", "resume")
    intents = wait_for(made, "the Rule to act once agents may", timeout_s=15)
    assert intents[0]["spec"]["requester"] == f"system:serviceaccount:{ns}:porch-rule"
    wait_for(lambda: ("open", False) in hardware_applies(acting.fleet, VALVE), "the valve to close", timeout_s=15)

    # The agent edits it: a new revision that waits again, and the grants to the Rule's ServiceAccount are void.
    objects.patch_namespaced_custom_object(GROUP, VERSION, ns, "rules", name, {"spec": {"cooldown": "20m"}})
    wait_for(lambda: state() == "AwaitingAcceptance", "the edited Rule to wait for a person again", timeout_s=15)

    def voided() -> dict[str, Any] | None:
        got = kubernetes.client.CustomObjectsApi(governed.person).get_namespaced_custom_object(
            GROUP, VERSION, ns, "approvalgrants", f"{name}-grant")
        return (got.get("status") or {}).get("voided")
    void = wait_for(voided, "the controller to void the grant to the Rule's ServiceAccount", timeout_s=15)
    assert void["rule"] == name and void["generation"] == 2, void

    records = [r for r in read_records(acting.controller.audit_dir)
               if r.kind == REVISED and r.data.get("rule") == name]
    assert [(r.data["generation"], r.data["author"], r.data["authorIsPerson"]) for r in records] == [
        (1, governed.agent_username, False), (2, governed.agent_username, False)], records
    # Every grant to porch-rule made before the edit (the one renewed by the test above too), none to anyone else.
    assert f"{name}-grant" in records[1].data["voidedGrants"] and "for-the-agent" not in records[1].data["voidedGrants"]
    assert void["audit"]["seq"] == records[1].seq
    assert governed.rule(name)["status"]["revisionAudit"]["seq"] == records[1].seq
    print(f"acceptance and pause: {time.monotonic() - started:.1f} s")


# ---- issue 41, findings 5 and 6: a person accepts or restores exactly the revision shown, and a recorded one -----

def recorded(governed: Governed, name: str, generation: int) -> None:
    """Until the controller has recorded this revision (rule.revised, listed in status.revisions)."""
    wait_for(lambda: any(r["generation"] == generation for r in
                         (governed.rule(name).get("status") or {}).get("revisions") or []),
             f"the controller to record revision {generation} of {name}", timeout_s=20)


def agent_writes(governed: Governed, name: str, level: int, cooldown: str | None = None,
                 previous: str | None = None) -> int:
    """The agent replaces the spec as iot.rules.put does (the replaced spec kept in the annotation), or keeps
    `previous` there instead: what it may write at the API server with its own token. The new generation."""
    objects = kubernetes.client.CustomObjectsApi(governed.agent)
    for _ in range(5):
        body = objects.get_namespaced_custom_object(GROUP, VERSION, governed.namespace, "rules", name)
        body.pop("status", None)
        current = RuleSpec.model_validate(body["spec"])
        spec = {**body["spec"], "author": governed.agent_username,
                "actions": [{**body["spec"]["actions"][0], "value": level}], **({"cooldown": cooldown} if cooldown else {})}
        spec.pop("authorGroups", None)
        body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}),
                                           PREVIOUS_SPEC_ANNOTATION: previous or kept_annotation(current)}
        body["spec"] = spec
        try:
            written = objects.replace_namespaced_custom_object(GROUP, VERSION, governed.namespace, "rules", name, body)
            return int(written["metadata"]["generation"])
        except kubernetes.client.ApiException as err:
            if err.status != 409:  # the controller's status write came between: read again
                raise
    raise AssertionError("the Rule kept changing")


def restore_as_agent(governed: Governed, name: str, generation: int) -> Any:
    async def session() -> Any:
        async with stdio_client(governed.agent_kubeconfig) as client:
            return await client.call_tool("iot.rules.restore", {"name": name, "generation": generation})
    return asyncio.run(asyncio.wait_for(session(), 60))


def test_a_restore_runs_only_a_recorded_revision_the_person_was_shown(governed: Governed, acting: Acting) -> None:
    ns, name = governed.namespace, f"guard-{uuid.uuid4().hex[:6]}"
    kubernetes.client.CustomObjectsApi(governed.person).create_namespaced_custom_object(
        GROUP, VERSION, ns, "rules", rule_body(name, governed.person_username, level=10))
    recorded(governed, name, 1)
    assert agent_writes(governed, name, 100) == 2  # the malicious revision: full light all night
    recorded(governed, name, 2)
    assert agent_writes(governed, name, 20) == 3  # then a harmless one: the malicious one is kept to be restored
    recorded(governed, name, 3)

    # A restore of a revision nobody was shown: refused, and nothing changes.
    said = governed.refused("rules", "restore", name)
    assert "--generation is required when not interactive" in said, said
    said = governed.refused("rules", "restore", name, "--generation", "2")
    assert "is at revision 3, not 2" in said, said
    said = governed.refused("rules", "restore", name, typed="y\n")
    assert "you typed 'y', not 3" in said and '"value": 100' in said, "shown the malicious spec, not confirmed"
    assert governed.rule(name)["metadata"]["generation"] == 3

    # The agent writes the kept revision itself: alone, admission refuses it; with a trivial edit it is admitted,
    # but matches no revision the controller recorded, so neither the person's nor the agent's restore runs it.
    forged = kept_annotation(RuleSpec.model_validate({**rule_body(name, governed.person_username, level=0)["spec"]}))
    said = _refused(governed.agent, ns, "patch_namespaced_custom_object", name,
                    {"metadata": {"annotations": {PREVIOUS_SPEC_ANNOTATION: forged}}})
    assert PREVIOUS_SPEC_ANNOTATION in said and "only together with a change of spec" in said, said
    assert agent_writes(governed, name, 20, cooldown="11m", previous=forged) == 4
    recorded(governed, name, 4)
    said = governed.refused("rules", "restore", name, "--generation", "4")
    assert "matches no revision the controller recorded" in said, said
    answer = restore_as_agent(governed, name, 4)
    assert answer.is_error and "matches no revision the controller recorded" in answer.structured_content["message"]
    assert governed.rule(name)["metadata"]["generation"] == 4

    # The positive control: a recorded revision, shown, restored by naming the revision read.
    assert agent_writes(governed, name, 30) == 5
    recorded(governed, name, 5)
    shown = governed.corral("rules", "show", name)
    assert f"The kept previous revision is revision 4 by {governed.agent_username}, who is not a person" in shown
    done = governed.corral("rules", "restore", name, "--generation", "5")
    assert "Restoring revision 4" in done and "restored as revision 6" in done, done
    stored = governed.rule(name)
    assert (stored["spec"]["actions"][0]["value"], stored["spec"]["cooldown"], stored["spec"]["author"]) == (
        20, "11m", governed.person_username)
    # At a terminal: shown, then the revision number typed; restoring again toggles back.
    recorded(governed, name, 6)
    done = governed.typing("6\n", "rules", "restore", name)
    assert '"value": 30' in done and "restored as revision 7" in done, done
    # The agent's restore does the same for agents: the generation it read, and its revision waits for a person.
    recorded(governed, name, 7)
    answer = restore_as_agent(governed, name, 7)
    assert not answer.is_error, answer.content
    assert answer.structured_content["restored"]["generation"] == 6 and answer.structured_content["acts"] is False
    assert restore_as_agent(governed, name, 7).is_error, "generation 7 is gone: refused"


def test_an_acceptance_binds_to_the_revision_the_person_was_shown(governed: Governed, acting: Acting) -> None:
    ns, name = governed.namespace, f"accept-{uuid.uuid4().hex[:6]}"
    kubernetes.client.CustomObjectsApi(governed.agent).create_namespaced_custom_object(
        GROUP, VERSION, ns, "rules", rule_body(name, governed.agent_username, level=80))
    recorded(governed, name, 1)
    said = governed.refused("rules", "accept", name)
    assert "--generation is required when not interactive" in said, said
    assert ACCEPTED_ANNOTATION not in (governed.rule(name)["metadata"].get("annotations") or {})

    assert "revision 1" in governed.corral("rules", "show", name)
    assert agent_writes(governed, name, 100) == 2  # changed after the person looked
    recorded(governed, name, 2)
    said = governed.refused("rules", "accept", name, "--generation", "1")
    assert "is at revision 2, not 1" in said, said
    # And the API server itself admits an acceptance of the current generation only.
    said = _refused(governed.person, ns, "patch_namespaced_custom_object", name,
                    {"metadata": {"annotations": {ACCEPTED_ANNOTATION: f"1:{governed.person_username}"}}})
    assert f'must be exactly "2:{governed.person_username}"' in said, said

    done = governed.corral("rules", "accept", name, "--generation", "2")
    assert '"value": 100' in done and f"accepted by {governed.person_username}" in done, done
    annotations = governed.rule(name)["metadata"]["annotations"]
    assert annotations[ACCEPTED_ANNOTATION] == f"2:{governed.person_username}"

    assert agent_writes(governed, name, 90) == 3
    recorded(governed, name, 3)
    said = governed.refused("rules", "accept", name, typed="2\n")
    assert "you typed '2', not 3" in said and '+      "value": 90' in said, said
    governed.typing("3\n", "rules", "accept", name)
    assert governed.rule(name)["metadata"]["annotations"][ACCEPTED_ANNOTATION] == f"3:{governed.person_username}"
