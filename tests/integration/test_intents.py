"""Intents and approvals end to end: three identities, real RBAC, real firmware, every decision code.

reader may read devices; operator may write them (and, to try self-approval,
approve); approver may approve. Each acts with its own ServiceAccount token,
as an agent or a person would. Executions are counted on the simulated hardware.
"""

from __future__ import annotations

import os
import subprocess
import sys
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

from corral.api.codes import API_VERSION, GROUP, PEOPLE_NAMESPACE, VERSION
from corral.client.intents import Identity, approval_body, decide_on, identity, submit, wait_settled
from corral.devcluster.plane import Plane
from corral_sim.fleet import Faults
from tests.controller_harness import ControllerProcess, device, events, set_target
from tests.fleet_harness import hardware_applies, on_fleet, running_fleet
from tests.harness import (
    api_client,
    apply_yaml,
    grant,
    person_name,
    person_user,
    service_account_token,
    wait_for,
    wait_until_allowed,
)

pytestmark = pytest.mark.integration

FLEET = {"kitchen-light": "light", "front-lock": "lock", "hall-fan": "env_fan"}
PEOPLE = {"approver"}  # ServiceAccounts in the people namespace; the others are programs


@dataclass
class Home:
    namespace: str
    prefix: str
    fleet: Any
    reader: kubernetes.client.ApiClient
    operator: kubernetes.client.ApiClient
    approver: kubernetes.client.ApiClient
    admin: kubernetes.client.ApiClient

    def user(self, name: str) -> str:
        if name in PEOPLE:
            return person_user(self.namespace, name)
        return f"system:serviceaccount:{self.namespace}:{name}"

    def applies(self, device_id: str) -> list[tuple[str, Any]]:
        return hardware_applies(self.fleet, device_id)


@pytest.fixture
def home(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[Home]:
    prefix = f"int-{uuid.uuid4().hex[:8]}"
    grants = {
        "reader": ("[get, list, read, listen]", "[get]"),
        "operator": ("[get, list, read, listen, write, approve]", "[get, create]"),
        "approver": ("[get, list, read, approve]", "[get, list, create]"),
    }
    clients = {}
    for name, (device_verbs, approval_verbs) in grants.items():
        clients[name] = grant(plane, corral_api, namespace, name, device_verbs, approval_verbs, "get",
                              person=name in PEOPLE)
    with running_fleet(plane, prefix, FLEET, enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log",
                                       "--intent-timeout", "4", "--approval-window", "60",
                                       "--rate-limit", "30/60")  # the product's default (the harness has none)
        controller.start()
        try:
            # inSync alone holds before a device first reports (nothing targeted yet): the tests' "before" needs
            # its state known.
            wait_for(lambda: all((s := device(corral_api, namespace, d).get("status") or {}).get("inSync")
                                 and s.get("reported") for d in FLEET),
                     "every device registered, reporting its state, and in sync", timeout_s=30)
            yield Home(namespace, prefix, fleet, clients["reader"], clients["operator"], clients["approver"], corral_api)
        finally:
            controller.stop()


def spec(home: Home, who: str, device_name: str, actuator: str, action: str, value: Any, **extra: Any) -> dict[str, Any]:
    params = {} if action == "read" else {"params": {"value": value}}
    return {"device": device_name, "actuator": actuator, "action": action, **params,
            "reason": "test", "requester": home.user(who), **extra}


def ask(home: Home, who: str, client: kubernetes.client.ApiClient, *args: Any, **extra: Any) -> dict[str, Any]:
    name = f"req-{uuid.uuid4().hex[:8]}"
    submitted = submit(client, home.namespace, name, spec(home, who, *args, **extra))
    assert submitted.code == "CREATED"
    return wait_settled(client, home.namespace, name, timeout_s=20)


def status(intent: dict[str, Any]) -> tuple[str | None, str | None]:
    s = intent.get("status") or {}
    return s.get("phase"), s.get("code")


def test_a_low_risk_write_by_an_operator_executes_with_before_and_after(home: Home) -> None:
    intent = ask(home, "operator", home.operator, "kitchen-light", "power", "set_state", True)
    assert status(intent) == ("Succeeded", "EXECUTED")
    assert intent["status"]["before"]["power"] is False and intent["status"]["after"]["power"] is True
    assert home.applies("kitchen-light").count(("power", True)) == 1
    assert device(home.admin, home.namespace, "kitchen-light")["spec"]["target"]["power"] is True


def test_the_same_request_twice_runs_once_and_a_reused_name_is_a_conflict(home: Home) -> None:
    request = spec(home, "operator", "kitchen-light", "brightness", "set_value", 35)
    first = submit(home.operator, home.namespace, "dim-35", request)
    wait_settled(home.operator, home.namespace, "dim-35", timeout_s=20)
    again = submit(home.operator, home.namespace, "dim-35", {**request, "reason": "said again"})
    other = submit(home.operator, home.namespace, "dim-35", {**request, "params": {"value": 80}})
    assert (first.code, again.code, other.code) == ("CREATED", "DEDUP", "DENY_ID_CONFLICT")
    assert status(again.intent) == ("Succeeded", "EXECUTED")
    assert home.applies("kitchen-light").count(("brightness", 35)) == 1


@pytest.mark.parametrize(
    ("who", "args", "extra", "code", "message"),
    [
        ("operator", ("kitchen-light", "siren", "set_state", True), {}, "DENY_UNKNOWN_ACTION", "no actuator 'siren'"),
        ("operator", ("kitchen-light", "power", "set_value", 1), {}, "DENY_UNKNOWN_ACTION", "set with set_state"),
        ("operator", ("kitchen-light", "brightness", "set_value", 140), {}, "DENY_ARGUMENTS", "from 0 to 100"),
        ("reader", ("kitchen-light", "power", "set_state", True), {}, "DENY_SCOPE", "'write' verb"),
        ("operator", ("kitchen-light", "firmware", "set_version", "1.3.0"), {}, "DENY_SCOPE", "'config' verb"),
        ("operator", ("hall-fan", "fan", "set_level", "high"),
         {"basedOn": [{"metric": "temperature", "ts": 1_000}]}, "DENY_SENSOR", "is not a sample the controller received"),
        ("operator", ("ghost-device", "power", "set_state", True), {}, "DEVICE_GONE", "does not exist"),
    ],
)
def test_refusals_carry_their_code_and_reason_and_nothing_reaches_a_device(
    home: Home, who: str, args: tuple[Any, ...], extra: dict[str, Any], code: str, message: str
) -> None:
    before = {d: len(home.applies(d)) for d in FLEET}
    intent = ask(home, who, getattr(home, who), *args, **extra)
    assert status(intent)[1] == code
    assert message in intent["status"]["message"]
    assert {d: len(home.applies(d)) for d in FLEET} == before


def test_a_recent_looking_ts_that_never_arrived_is_no_evidence(home: Home) -> None:
    # Once it was enough to be young by the clock; now the cited sample must be one the controller received.
    # Citing one that did arrive: tests/integration/test_agent_reliance.py.
    invented = int(time.time() * 1000) - 137
    intent = ask(home, "operator", home.operator, "hall-fan", "fan", "set_level", "mid",
                 basedOn=[{"metric": "temperature", "ts": invented}])
    assert status(intent) == ("Denied", "DENY_SENSOR")
    assert f"ts={invented} is not a sample the controller received" in intent["status"]["message"]
    # And what to cite instead: the freshest sample, or (none arrived yet) to wait for one.
    assert "cite" in intent["status"]["message"]


def test_a_high_risk_write_waits_for_an_approver_then_runs_exactly_once(home: Home) -> None:
    intent = ask(home, "operator", home.operator, "front-lock", "locked", "set_state", True)
    assert status(intent) == ("AwaitingApproval", None)
    assert home.applies("front-lock").count(("locked", True)) == 0
    decide_on(home.approver, home.namespace, intent["metadata"]["name"], "Approve", "leaving the house")
    done = wait_for(lambda: (i := wait_settled(home.operator, home.namespace, intent["metadata"]["name"], 10))
                    and status(i)[0] in ("Succeeded", "Denied", "Failed") and i, "the approved Intent to finish",
                    timeout_s=20)
    assert status(done) == ("Succeeded", "EXECUTED")
    assert home.applies("front-lock").count(("locked", True)) == 1
    approval = kubernetes.client.CustomObjectsApi(home.admin).list_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "approvals")["items"][0]
    assert approval["status"]["consumed"] is True


def _settled_final(home: Home, name: str) -> dict[str, Any]:
    return wait_for(lambda: (i := wait_settled(home.admin, home.namespace, name, 10))
                    and status(i)[0] in ("Succeeded", "Denied", "Failed") and i, f"Intent {name} to finish",
                    timeout_s=20)


def _approval(home: Home, intent: dict[str, Any], approver: str, **changes: Any) -> dict[str, Any]:
    body = {
        "apiVersion": API_VERSION, "kind": "Approval",
        "metadata": {"name": f"apr-{uuid.uuid4().hex[:8]}"},
        "spec": {"intent": {"name": intent["metadata"]["name"], "uid": intent["metadata"]["uid"]},
                 "paramsHash": intent["status"]["paramsHash"], "decision": "Approve",
                 "approver": home.user(approver), **changes},
    }
    client = getattr(home, approver)
    return kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "approvals", body)


def test_a_denial_ends_the_intent_denied_by_approver(home: Home) -> None:
    intent = ask(home, "operator", home.operator, "front-lock", "locked", "set_state", False)
    decide_on(home.approver, home.namespace, intent["metadata"]["name"], "Deny", "not while the kids are out")
    done = _settled_final(home, intent["metadata"]["name"])
    assert status(done) == ("Denied", "DENIED_BY_APPROVER")
    assert "not while the kids are out" in done["status"]["message"]


def _approval_status(home: Home, name: str) -> dict[str, Any]:
    return kubernetes.client.CustomObjectsApi(home.admin).get_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "approvals", name).get("status") or {}


@pytest.mark.parametrize(
    ("attack", "message"),
    [
        ("self-approval", "cannot decide on their own request"),
        ("other-parameters", "other parameters"),
        ("expired", "expired"),
        ("replay", "for another Intent"),
    ],
)
def test_an_approval_that_does_not_count_is_refused_the_intent_waits_and_a_valid_one_runs_it_once(
        home: Home, attack: str, message: str) -> None:
    intent = ask(home, "operator", home.operator, "front-lock", "locked", "set_state", True)
    name = intent["metadata"]["name"]
    before = home.applies("front-lock").count(("locked", True))
    if attack == "self-approval":
        bad = _approval(home, intent, "operator")
    elif attack == "other-parameters":
        bad = _approval(home, intent, "approver", paramsHash="0" * 64)
    elif attack == "expired":
        bad = _approval(home, intent, "approver", expiresAt=(datetime.now(UTC) - timedelta(minutes=1)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"))
    else:
        earlier = ask(home, "operator", home.operator, "front-lock", "locked", "set_state", True)
        replayed = dict(intent)
        replayed["metadata"] = {**intent["metadata"], "uid": earlier["metadata"]["uid"]}
        bad = _approval(home, replayed, "approver")
    refused = wait_for(lambda: (s := _approval_status(home, bad["metadata"]["name"])).get("refused") and s,
                       "the approval marked refused")
    assert message in refused["message"]
    # The Approval's status is written first, then the Intent's message names the refusal.
    waiting = wait_for(lambda: (i := wait_settled(home.admin, home.namespace, name, 1)) and message in (
        i["status"].get("message") or "") and i, "the Intent's message to name the refusal")
    assert status(waiting) == ("AwaitingApproval", None)
    assert any(e.reason == "ApprovalRefused" and message in (e.note or "")
               for e in events(home.admin, home.namespace, bad["metadata"]["name"]))
    assert home.applies("front-lock").count(("locked", True)) == before
    decide_on(home.approver, home.namespace, name, "Approve", "the right one")
    assert status(_settled_final(home, name)) == ("Succeeded", "EXECUTED")
    assert home.applies("front-lock").count(("locked", True)) == before + 1


def test_only_people_approve_and_a_group_counts_only_when_the_api_server_vouches_for_it(
        plane: Plane, home: Home) -> None:
    # The operator holds `approve` but is a ServiceAccount of the agents' namespace: a program, never a person.
    admin = identity(home.admin)  # its rights come from a group (system:masters), which the Intent carries
    intent = ask(home, "admin", home.admin, "front-lock", "locked", "set_state", True, requester=admin.username,
                 requesterGroups=list(admin.groups))
    assert status(intent) == ("AwaitingApproval", None), intent.get("status")
    program = _approval(home, intent, "operator")
    refused = wait_for(lambda: (s := _approval_status(home, program["metadata"]["name"])).get("refused") and s,
                       "the ServiceAccount's approval refused")
    assert "outside corral-people, the namespace for people" in refused["message"]
    # A RoleBinding to a group of people: carol holds approve only as a member of "household" (an identity
    # provider's group; here impersonation, which counts as the impersonated identity).
    apply_yaml(home.admin, HOUSEHOLD_APPROVERS, home.namespace)
    carol = api_client(plane, impersonate="carol", group="household")
    wait_until_allowed(carol, "approve", home.namespace, "devices")
    # Claiming a group one is not in is refused by the API server, before the controller ever sees it: dave may
    # create Approvals, and is no member of household.
    dave = api_client(plane, impersonate="dave")
    wait_until_allowed(dave, "create", home.namespace, "approvals")
    with pytest.raises(kubernetes.client.ApiException) as forged:
        kubernetes.client.CustomObjectsApi(dave).create_namespaced_custom_object(
            GROUP, VERSION, home.namespace, "approvals", approval_body(intent_now(home, intent), "Approve", "",
                                                                         Identity("dave", ("household",)),
                                                                         timedelta(minutes=5)))
    assert forged.value.status == 403
    assert "approverGroups must be exactly the groups you are authenticated with" in forged.value.body
    decide_on(carol, home.namespace, intent["metadata"]["name"], "Approve", "group member")
    done = _settled_final(home, intent["metadata"]["name"])
    assert status(done) == ("Succeeded", "EXECUTED")
    assert _approval_status(home, done["status"]["approval"])["consumed"] is True
    assert done["status"]["approval"].startswith(f"{intent['metadata']['name']}-approve-carol-")


def intent_now(home: Home, intent: dict[str, Any]) -> dict[str, Any]:
    return kubernetes.client.CustomObjectsApi(home.admin).get_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "intents", intent["metadata"]["name"])


HOUSEHOLD_APPROVERS = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: household-approvers}
rules:
- {apiGroups: [corral.dev], resources: [devices], verbs: [get, list, read, approve]}
- {apiGroups: [corral.dev], resources: [intents], verbs: [get, list]}
- {apiGroups: [corral.dev], resources: [approvals], verbs: [get, list, create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: household-approvers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: household-approvers}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: household}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: approval-writer}
rules: [{apiGroups: [corral.dev], resources: [approvals], verbs: [create]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: approval-writer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: approval-writer}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: dave}]
"""


def test_a_requester_cannot_pretend_to_be_someone_else(home: Home) -> None:
    forged = spec(home, "approver", "kitchen-light", "power", "set_state", True)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        submit(home.operator, home.namespace, "in-your-name", forged)
    assert refused.value.status == 403
    assert "must be your own username" in yaml.safe_load(refused.value.body)["message"]


def test_an_offline_device_is_device_gone(home: Home) -> None:
    on_fleet(home.fleet, lambda: home.fleet.drop_link("hall-fan", down_s=30))
    wait_for(lambda: device(home.admin, home.namespace, "hall-fan")["status"]["online"] is False, "the fan offline")
    intent = ask(home, "operator", home.operator, "hall-fan", "fan", "set_level", "low")
    assert status(intent) == ("Failed", "DEVICE_GONE")


def test_a_device_that_does_not_answer_in_time_is_timeout(plane: Plane, home: Home) -> None:
    # A device whose acks take 6 s, longer than the controller's 4 s intent timeout.
    with running_fleet(plane, home.prefix, {"slow-light": "light"}, faults=Faults(ack_delay_ms=6000),
                       enroll_in=(home.admin, home.namespace)):
        wait_for(lambda: (device(home.admin, home.namespace, "slow-light").get("status") or {}).get("online"),
                 "the slow light registered and online", timeout_s=30)
        intent = ask(home, "operator", home.operator, "slow-light", "power", "set_state", True)
    assert status(intent) == ("Failed", "TIMEOUT")
    command = intent["status"]["commandId"]
    assert f"did not acknowledge command {command} (power=true) within 4 s" in intent["status"]["message"]


def test_a_device_that_acks_an_error_fails_the_intent(home: Home) -> None:
    on_fleet(home.fleet, lambda: home.fleet.jam("kitchen-light", "brightness"))
    intent = ask(home, "operator", home.operator, "kitchen-light", "brightness", "set_value", 65)
    assert status(intent) == ("Failed", "FAILED")
    assert "The device refused" in intent["status"]["message"] and "jammed" in intent["status"]["message"]
    assert ("brightness", 65) not in home.applies("kitchen-light")


def test_a_field_a_person_manages_is_not_overwritten_the_intent_fails(home: Home) -> None:
    set_target(home.admin, home.namespace, "hall-fan", {"fan": "low"})  # server-side apply as "kubectl"
    intent = ask(home, "operator", home.operator, "hall-fan", "fan", "set_level", "high")
    assert status(intent) == ("Failed", "FAILED")
    assert "managed by someone else" in intent["status"]["message"]
    assert device(home.admin, home.namespace, "hall-fan")["spec"]["target"]["fan"] == "low"


def _kubeconfig_for(plane: Plane, token: str, path: Path) -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "plane", "cluster": {"server": plane.server, "certificate-authority": str(plane.ca_file)}}],
        "users": [{"name": "me", "user": {"token": token}}],
        "contexts": [{"name": "me", "context": {"cluster": "plane", "user": "me"}}],
        "current-context": "me",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_people_list_and_approve_pending_intents_with_the_cli(
    plane: Plane, home: Home, corral_api: kubernetes.client.ApiClient, tmp_path: Path
) -> None:
    intent = ask(home, "operator", home.operator, "front-lock", "locked", "set_state", True)
    kubeconfig = _kubeconfig_for(plane, service_account_token(corral_api, PEOPLE_NAMESPACE,
                                                              person_name(home.namespace, "approver")),
                                 tmp_path / "approver.kubeconfig")
    corral = [str(Path(sys.executable).parent / "corral")]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    listed = subprocess.run([*corral, "intents", "-n", home.namespace], capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    assert intent["metadata"]["name"] in listed.stdout and "AwaitingApproval" in listed.stdout
    approved = subprocess.run([*corral, "approve", intent["metadata"]["name"], "-n", home.namespace,
                               "--reason", "expected"], capture_output=True, text=True, env=env)
    assert approved.returncode == 0, approved.stderr
    assert f"approved by {home.user('approver')}" in approved.stdout
    assert "(Approval " in approved.stdout and "the controller took it: the Intent " in approved.stdout
    assert status(_settled_final(home, intent["metadata"]["name"])) == ("Succeeded", "EXECUTED")

    again = subprocess.run([*corral, "approve", intent["metadata"]["name"], "-n", home.namespace],
                           capture_output=True, text=True, env=env)
    assert again.returncode == 1 and "is not waiting for approval (phase Succeeded)" in again.stderr


def test_cli_exit_statuses_tell_refusals_from_successes_and_a_refused_approval_is_not_approved(
    plane: Plane, home: Home, corral_api: kubernetes.client.ApiClient, tmp_path: Path
) -> None:
    corral = [str(Path(sys.executable).parent / "corral")]
    kubeconfigs = {who: _kubeconfig_for(plane, service_account_token(corral_api, home.namespace, who),
                                        tmp_path / f"{who}.kubeconfig") for who in ("operator", "reader")}

    def run(who: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*corral, *args, "-n", home.namespace, "--kubeconfig", str(kubeconfigs[who])],
                              capture_output=True, text=True, timeout=60)

    # A denial exits 3 and says what happened; the control, the same request by someone allowed, exits 0.
    denied = run("reader", "intents", "create", "kitchen-light", "power=true", "--action", "set_state", "--reason", "t")
    assert (denied.returncode, "DENY_SCOPE" in denied.stdout) == (3, True), denied
    done = run("operator", "intents", "create", "kitchen-light", "power=true", "--action", "set_state", "--reason", "t")
    assert (done.returncode, ": EXECUTED: " in done.stdout, "power=true" in done.stdout) == (0, True, True), done
    # A dry run of a high-risk change would wait: that is its answer (0), and it does not send anyone to approve
    # what cannot be approved; a dry run that would be refused exits 3.
    dry = run("operator", "intents", "create", "front-lock", "locked=true", "--action", "set_state", "--reason", "t",
              "--dry-run")
    assert (dry.returncode, "AWAITING_APPROVAL (dry run)" in dry.stdout) == (0, True), dry
    dry_denied = run("reader", "intents", "create", "front-lock", "locked=true", "--action", "set_state", "--reason",
                     "t", "--dry-run")
    assert (dry_denied.returncode, "DENY_SCOPE (dry run)" in dry_denied.stdout) == (3, True), dry_denied
    assert "corral approve" not in dry.stdout and "cannot be approved" in dry.stdout

    # The requester's own approval is refused before it is made (exit 3), saying why and what to do instead.
    waiting = run("operator", "intents", "create", "front-lock", "locked=true", "--action", "set_state", "--reason", "t")
    assert waiting.returncode == 5 and "AWAITING_APPROVAL" in waiting.stdout, waiting
    name = waiting.stdout.split(":")[0]
    own = run("operator", "approve", name)
    assert own.returncode == 3 and "is your own request" in own.stderr and "corral.dev/cancel" in own.stderr, own
    objects = kubernetes.client.CustomObjectsApi(home.admin)
    assert not [a for a in objects.list_namespaced_custom_object(GROUP, VERSION, home.namespace, "approvals")["items"]
                if a["spec"]["intent"]["name"] == name], "no Approval is made for one's own request"

    # A program's approval of someone else's request is made, refused by the controller, and exits 3 with its reason.
    admin = identity(home.admin)  # its rights come from its group (system:masters): the Intent names it
    submit(home.admin, home.namespace, "admin-unlock", {**spec(home, "operator", "front-lock", "locked", "set_state",
                                                               False), "requester": admin.username,
                                                        "requesterGroups": list(admin.groups)})
    asked = wait_settled(home.admin, home.namespace, "admin-unlock", 20)
    assert status(asked)[0] == "AwaitingApproval", asked.get("status")
    program = run("operator", "approve", "admin-unlock")
    assert program.returncode == 3 and "does not count" in program.stderr, program
    assert "outside corral-people" in program.stderr and "keeps waiting" in program.stderr
    assert status(wait_settled(home.admin, home.namespace, "admin-unlock", 1))[0] == "AwaitingApproval"
    assert home.applies("front-lock").count(("locked", False)) == 0


def test_finished_intents_are_deleted_after_their_ttl(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    prefix = f"ttl-{uuid.uuid4().hex[:8]}"
    with running_fleet(plane, prefix, {"ttl-light": "light"}, enroll_in=(corral_api, namespace)):
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log", "--intent-retention", "2")
        controller.start()
        try:
            wait_for(lambda: (device(corral_api, namespace, "ttl-light").get("status") or {}).get("online"),
                     "the light online", timeout_s=30)
            operator = grant(plane, corral_api, namespace, "operator", "[get, write]", "[get]", "write")
            request = {"device": "ttl-light", "actuator": "power", "action": "set_state", "params": {"value": True},
                       "reason": "test", "requester": f"system:serviceaccount:{namespace}:operator"}
            submit(operator, namespace, "short-lived", request)
            assert status(wait_settled(operator, namespace, "short-lived", 20)) == ("Succeeded", "EXECUTED")
            objects = kubernetes.client.CustomObjectsApi(corral_api)
            wait_for(lambda: not objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "intents")["items"],
                     "the finished Intent deleted after its TTL", timeout_s=15)
        finally:
            controller.stop()


def test_a_request_nobody_approves_expires_as_deny_approval(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    prefix = f"exp-{uuid.uuid4().hex[:8]}"
    with running_fleet(plane, prefix, {"shed-lock": "lock"}, enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log", "--approval-window", "2")
        controller.start()
        try:
            wait_for(lambda: (device(corral_api, namespace, "shed-lock").get("status") or {}).get("online"),
                     "the lock online", timeout_s=30)
            operator = grant(plane, corral_api, namespace, "operator", "[get, write]", "[get]", "write")
            request = {"device": "shed-lock", "actuator": "locked", "action": "set_state", "params": {"value": True},
                       "reason": "test", "requester": f"system:serviceaccount:{namespace}:operator"}
            submit(operator, namespace, "unattended", request)
            assert status(wait_settled(operator, namespace, "unattended", 10)) == ("AwaitingApproval", None)
            expired = wait_for(
                lambda: (i := wait_settled(operator, namespace, "unattended", 1)) and status(i)[0] == "Denied" and i,
                "the unapproved Intent to expire", timeout_s=15,
            )
        finally:
            controller.stop()
        assert status(expired) == ("Denied", "DENY_APPROVAL")
        assert "No valid approval arrived within" in expired["status"]["message"]
        assert ("locked", True) not in hardware_applies(fleet, "shed-lock")


def test_a_read_is_answered_from_the_device_and_changes_no_target(home: Home) -> None:
    wait_for(lambda: device(home.admin, home.namespace, "hall-fan")["status"].get("sensors"),
             "the fan's first telemetry", timeout_s=15)
    before = device(home.admin, home.namespace, "hall-fan")["spec"].get("target")
    intent = ask(home, "reader", home.reader, "hall-fan", "fan", "read", None)
    assert status(intent) == ("Succeeded", "EXECUTED")
    assert "read from the device just now" in intent["status"]["message"]
    assert "fan" in intent["status"]["after"] and "temperature" in intent["status"]["after"]
    assert device(home.admin, home.namespace, "hall-fan")["spec"].get("target") == before


def test_intents_made_straight_at_the_api_server_are_rate_limited_per_requester(home: Home) -> None:
    """The attack: the agent's token is good at the API server too, so creating Intents there skipped the gateway's
    30-per-minute limit (60 of 60 executed in 9.2 s). The controller's pipeline limits each requester itself."""
    objects = kubernetes.client.CustomObjectsApi(home.operator)
    names = [f"flood-{i:02d}" for i in range(60)]
    for i, name in enumerate(names):  # one agent, its own ServiceAccount token, straight at the API server
        body = {"apiVersion": API_VERSION, "kind": "Intent", "metadata": {"name": name},
                "spec": spec(home, "operator", "kitchen-light", "brightness", "set_value", i + 1)}
        objects.create_namespaced_custom_object(GROUP, VERSION, home.namespace, "intents", body)
    # Meanwhile another requester (the admin, a person) is not limited: the positive control.
    admin = identity(home.admin)
    theirs = submit(home.admin, home.namespace, "admins-own", {**spec(home, "operator", "kitchen-light", "power",
                                                                      "set_state", True),
                                                               "requester": admin.username,
                                                               "requesterGroups": list(admin.groups)})
    assert theirs.code == "CREATED"

    def settled() -> dict[str, dict[str, Any]] | None:
        items = objects.list_namespaced_custom_object(GROUP, VERSION, home.namespace, "intents")["items"]
        mine = {i["metadata"]["name"]: i for i in items if i["metadata"]["name"].startswith("flood-")}
        done = len(mine) == 60 and all((i.get("status") or {}).get("code") for i in mine.values())
        return mine if done else None

    flood = wait_for(settled, "all 60 Intents decided", timeout_s=60)
    codes = {name: intent["status"]["code"] for name, intent in flood.items()}
    executed = sorted(n for n, c in codes.items() if c == "EXECUTED")
    limited = sorted(n for n, c in codes.items() if c == "RATE_LIMITED")
    assert len(executed) + len(limited) == 60, codes
    created = [datetime.fromisoformat(i["metadata"]["creationTimestamp"]) for i in flood.values()]
    span_s = (max(created) - min(created)).total_seconds()
    # 30 at once, then one more every 2 s of the (whole-second) creation times: the gateway's bucket.
    assert 30 <= len(executed) <= 30 + int(span_s / 2) + 1, (span_s, len(executed))
    assert executed[:30] == names[:30]  # the first 30 in creation order got the slots
    message = flood[limited[0]]["status"]["message"]
    assert f"{home.user('operator')} is over its rate limit: at most 30 requests to act on devices" in message
    assert "Nothing was sent. The next slot frees at" in message
    # The device got exactly the allowed commands, one per executed Intent.
    wait_for(lambda: len([a for a, _ in home.applies("kitchen-light") if a == "brightness"]) == len(executed),
             "one brightness command per executed Intent")
    applied = {v for a, v in home.applies("kitchen-light") if a == "brightness"}
    assert applied == {flood[n]["spec"]["params"]["value"] for n in executed}
    assert status(wait_settled(home.admin, home.namespace, "admins-own", timeout_s=20)) == ("Succeeded", "EXECUTED")

