"""The durable audit against the real controller, API server, broker and firmware (issue 16).

What a person relying on the log would check: every decision is in it exactly once and says what the
Intent said; a controller killed mid-burst loses no decision a client saw and decides nothing twice; a
log that cannot be written stops new decisions (and says so) while devices keep being driven; and the
log is read over HTTPS only by those RBAC lets read it.

The tests share one namespace, fleet and controller (each setting up costs as much as a test), and keep
apart by the names of their Intents.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from click.testing import CliRunner

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.audit.chain import AuditRecord
from corral.audit.keys import load_private_key
from corral.audit.log import AuditLog, log_files, read_records
from corral.cli.main import cli
from corral.client.intents import submit
from corral.devcluster.plane import Plane
from corral.privatefile import write_private
from corral_sim.fleet import Fleet
from tests.controller_harness import ControllerProcess, device, set_target
from tests.fleet_harness import on_fleet, running_fleet
from tests.harness import apply_yaml, fresh_namespace, grant, service_account_token, wait_for

pytestmark = pytest.mark.integration

LIGHTS = ("lamp-a", "lamp-b")


@dataclass
class Audited:
    plane: Plane
    namespace: str
    fleet: Fleet
    admin: kubernetes.client.ApiClient
    operator: kubernetes.client.ApiClient
    stranger: kubernetes.client.ApiClient
    controller: ControllerProcess

    def intents(self, prefix: str) -> dict[str, dict[str, Any]]:
        """This test's Intents: those whose names start with `prefix`."""
        items = kubernetes.client.CustomObjectsApi(self.admin).list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "intents")["items"]
        return {item["metadata"]["name"]: item for item in items if item["metadata"]["name"].startswith(prefix)}

    def records(self) -> list[AuditRecord]:
        return list(read_records(self.controller.audit_dir))

    def verify(self) -> str:
        done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(self.controller.audit_dir), "--key",
                                        str(self.controller.audit_dir / "controller.pub.pem")])
        assert done.exit_code == 0, done.output
        return done.output


@pytest.fixture(scope="module")
def audited(plane: Plane, corral_api: kubernetes.client.ApiClient, kube: kubernetes.client.ApiClient,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audited]:
    with fresh_namespace(kube, "audit") as namespace:
        yield from _audited(plane, corral_api, namespace, tmp_path_factory.mktemp("audit"))


def _audited(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path
             ) -> Iterator[Audited]:
    operator = grant(plane, corral_api, namespace, "operator", "[get, list, read, write]", "[get]", "write")
    stranger = grant(plane, corral_api, namespace, "stranger", "[get]", "[get]", "get")
    prefix = f"aud-{uuid.uuid4().hex[:6]}"
    with running_fleet(plane, prefix, dict.fromkeys(LIGHTS, "light"), enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: all((device(corral_api, namespace, n).get("status") or {}).get("inSync") for n in LIGHTS),
                     "the lights registered and in sync", timeout_s=60)
            yield Audited(plane, namespace, fleet, corral_api, operator, stranger, controller)
        finally:
            controller.stop()


def mixed(prefix: str, count: int, operator: str, stranger: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, who, spec): executed, out of range, unknown actuator and not allowed, in turn."""
    asks = []
    for i in range(count):
        light = LIGHTS[i % len(LIGHTS)]
        kind = (i // len(LIGHTS)) % 4
        spec: dict[str, Any] = {"device": light, "actuator": "power", "action": "set_state",
                                "params": {"value": i % 3 == 0}, "reason": "audit test", "requester": operator}
        who = "operator"
        if kind == 1:
            spec.update(actuator="brightness", action="set_value", params={"value": 500})
        elif kind == 2:
            spec.update(actuator="warp_drive")
        elif kind == 3:
            spec, who = {**spec, "requester": stranger}, "stranger"
        asks.append((f"{prefix}{i:05d}", who, spec))
    return asks


def submit_all(audited: Audited, asks: list[tuple[str, str, dict[str, Any]]], workers: int = 8) -> None:
    clients = {"operator": audited.operator, "stranger": audited.stranger}

    def one(ask: tuple[str, str, dict[str, Any]]) -> None:
        name, who, spec = ask
        assert submit(clients[who], audited.namespace, name, spec).code == "CREATED"

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, asks))


def decided(records: list[AuditRecord]) -> dict[str, list[AuditRecord]]:
    by_uid: dict[str, list[AuditRecord]] = {}
    for record in records:
        if record.kind == "intent.decided" and record.uid:
            by_uid.setdefault(record.uid, []).append(record)
    return by_uid


def test_every_intent_has_exactly_one_decision_record_that_says_what_the_intent_said(
        audited: Audited, request: pytest.FixtureRequest) -> None:
    count = 10_000 if request.config.getoption("--slow") else 1_000
    ns = audited.namespace
    asks = mixed("mix-", count, f"system:serviceaccount:{ns}:operator", f"system:serviceaccount:{ns}:stranger")
    submit_all(audited, asks)
    wait_for(lambda: sum((i.get("status") or {}).get("phase") in FINAL_PHASES
                         for i in audited.intents("mix-").values()) == count,
             f"all {count} Intents decided", timeout_s=60 + count * 0.1)
    intents = audited.intents("mix-")
    codes = Counter(i["status"]["code"] for i in intents.values())
    assert set(codes) == {"EXECUTED", "DENY_ARGUMENTS", "DENY_UNKNOWN_ACTION", "DENY_SCOPE"}, codes
    records = decided(audited.records())
    for name, intent in intents.items():
        uid, status = intent["metadata"]["uid"], intent["status"]
        found = records.get(uid, [])
        assert len(found) == 1, f"Intent {name}: {len(found)} decision records"
        data = found[0].data
        assert (data["code"], data["message"]) == (status["code"], status["message"]), name
        assert (data.get("before"), data.get("after")) == (status.get("before"), status.get("after")), name
        assert data["requester"] == intent["spec"]["requester"] and data["params"] == intent["spec"].get("params")
        assert found[0].subject == f"{ns}/{name}"
        assert status["audit"]["seq"] == found[0].seq, f"Intent {name} cites another record than its decision"
    mine = {uid for uid, found in records.items() if found[0].subject.startswith(f"{ns}/mix-")}
    assert mine == {i["metadata"]["uid"] for i in intents.values()}
    executed = [r for uid in mine for r in records[uid] if r.data["code"] == "EXECUTED"]
    sent = {r.data["commandId"] for r in audited.records() if r.kind == "command.sent"}
    acked = {r.data["commandId"] for r in audited.records() if r.kind == "ack.received"}
    assert all(r.data["commandId"] in sent and r.data["commandId"] in acked for r in executed)
    assert "OK:" in audited.verify()


def test_a_controller_killed_mid_burst_keeps_every_decision_a_client_saw_and_decides_none_twice(
        audited: Audited) -> None:
    ns = audited.namespace
    asks = mixed("burst-", 120, f"system:serviceaccount:{ns}:operator", f"system:serviceaccount:{ns}:stranger")
    seen: dict[str, tuple[str, str]] = {}  # uid -> (code, message), as a client watching saw them
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for item in audited.intents("burst-").values():
                status = item.get("status") or {}
                if status.get("phase") in FINAL_PHASES:
                    seen.setdefault(item["metadata"]["uid"], (status["code"], status["message"]))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    submitter = threading.Thread(target=submit_all, args=(audited, asks, 4), daemon=True)
    submitter.start()
    wait_for(lambda: len(seen) >= 20, "some Intents decided", timeout_s=60)
    audited.controller.kill()
    at_kill = dict(seen)
    submitter.join(60)
    undecided = [i for i in audited.intents("burst-").values()
                 if (i.get("status") or {}).get("phase") not in FINAL_PHASES]
    assert undecided, "the burst was over before the kill: nothing was in flight"
    audited.controller.start()
    wait_for(lambda: len(audited.intents("burst-")) == len(asks) and all(
        (i.get("status") or {}).get("phase") in FINAL_PHASES for i in audited.intents("burst-").values()),
        "every Intent decided after the restart", timeout_s=120)
    stop.set()
    watcher.join(10)
    records = audited.records()
    by_uid = decided(records)
    for uid, (code, message) in at_kill.items():
        assert uid in by_uid, f"a decision a client saw ({code}) is not in the log"
        assert (by_uid[uid][0].data["code"], by_uid[uid][0].data["message"]) == (code, message)
    intents = audited.intents("burst-")
    assert all(len(by_uid.get(i["metadata"]["uid"], [])) == 1 for i in intents.values()), \
        Counter(len(by_uid.get(i["metadata"]["uid"], [])) for i in intents.values())
    uids = {i["metadata"]["uid"] for i in intents.values()}
    executing = Counter(r.uid for r in records if r.kind == "intent.executing" and r.uid in uids)
    assert max(executing.values()) == 1, "an Intent was decided to execute twice"
    assert "OK:" in audited.verify()  # one chain across the kill and the restart


def test_a_decision_on_disk_but_not_yet_in_status_is_restored_not_made_again(audited: Audited) -> None:
    """The window a kill -9 can hit: the record fsynced, the status write not made. Here it is made on
    purpose: with the controller stopped, its own key records a decision the pipeline would never make."""
    ns = audited.namespace
    power = hardware(audited, "lamp-a").get("power")
    audited.controller.stop()
    spec = {"device": "lamp-a", "actuator": "power", "action": "set_state", "params": {"value": not power},
            "reason": "audit test", "requester": f"system:serviceaccount:{ns}:operator"}
    submitted = submit(audited.operator, ns, "restore-me", spec)
    assert submitted.code == "CREATED"
    created = submitted.intent
    key = load_private_key(audited.controller.audit_key, create=False)
    log = AuditLog(audited.controller.audit_dir, "controller", key)
    log.open()
    message = "Recorded before the crash: denied for this test."
    asyncio.run(log.append("intent.decided", f"{ns}/restore-me", {"code": "DENY_INTERLOCK", "message": message,
                                                                  "before": None, "after": None},
                           uid=created["metadata"]["uid"]))
    log.close()
    audited.controller.start()
    objects = kubernetes.client.CustomObjectsApi(audited.admin)

    def status() -> dict[str, Any]:
        return objects.get_namespaced_custom_object(GROUP, VERSION, ns, "intents", "restore-me").get("status") or {}

    wait_for(lambda: status().get("phase") in FINAL_PHASES, "the Intent final", timeout_s=30)
    assert (status()["code"], status()["message"]) == ("DENY_INTERLOCK", message)
    uid = created["metadata"]["uid"]
    assert [r.kind for r in audited.records() if r.uid == uid] == ["intent.decided"]  # not judged again
    assert hardware(audited, "lamp-a").get("power") == power


def test_a_tail_cut_after_the_newest_checkpoint_fails_verification_against_the_cluster(
        audited: Audited, tmp_path: Path) -> None:
    """Finding 10: cutting the records written since the newest checkpoint left a valid chain that verified OK.
    Every Intent's final status cites its decision record, and `--against-cluster` holds the log to them."""
    ns = audited.namespace
    checkpoint = tmp_path / "checkpoint.json"
    newest = wait_for(lambda: checkpoint_spec(audited), "a checkpoint published")
    checkpoint.write_text(json.dumps(newest))
    spec = {"device": "lamp-b", "actuator": "power", "action": "set_state", "params": {"value": True},
            "reason": "audit test", "requester": f"system:serviceaccount:{ns}:operator"}
    assert submit(audited.operator, ns, "after-checkpoint", spec).code == "CREATED"
    final = wait_for(lambda: (s := audited.intents("after-checkpoint")["after-checkpoint"].get("status") or {})
                     .get("phase") in FINAL_PHASES and s, "the Intent decided")
    assert final["audit"]["seq"] > newest["seq"], "decided before the checkpoint: nothing to cut"
    untouched, cut = tmp_path / "untouched", tmp_path / "cut"
    copy_log(audited.controller.audit_dir, untouched, None)
    copy_log(audited.controller.audit_dir, cut, newest["seq"])  # the attack: every record after the checkpoint

    def verify(directory: Path, *extra: str) -> Any:
        return CliRunner().invoke(cli, ["audit", "verify", "--file", str(directory), "--key",
                                        str(audited.controller.audit_dir / "controller.pub.pem"), "--checkpoint",
                                        str(checkpoint), "--kubeconfig", str(audited.plane.kubeconfig), *extra])

    before = verify(cut)  # what the attack got before: the checkpoint alone cannot see the cut
    assert before.exit_code == 0 and "OK:" in before.output, before.output
    caught = verify(cut, "--against-cluster", "-n", ns)
    assert caught.exit_code == 1, caught.output
    assert (f"Intent {ns}/after-checkpoint cites its decision at seq {final['audit']['seq']}" in caught.output
            and f"but the log ends at seq {newest['seq']}" in caught.output), caught.output
    control = verify(untouched, "--against-cluster", "-n", ns)  # the positive control: the whole log
    assert control.exit_code == 0, control.output
    assert "decisions of" in control.output and "as their status cites them" in control.output, control.output


def checkpoint_spec(audited: Audited) -> dict[str, Any] | None:
    try:
        body = kubernetes.client.CustomObjectsApi(audited.admin).get_namespaced_custom_object(
            GROUP, VERSION, audited.namespace, "auditcheckpoints", "corral-controller")
    except kubernetes.client.ApiException:
        return None
    spec = body.get("spec") or {}
    return spec if spec.get("seq") else None


def copy_log(source: Path, target: Path, up_to_seq: int | None) -> None:
    """A copy of a live log's files, whole lines only; with up_to_seq, nothing after that record."""
    target.mkdir()
    for path in log_files(source):
        data = path.read_bytes()
        lines = data[:data.rfind(b"\n") + 1].splitlines()
        if up_to_seq is not None:
            lines = [line for line in lines if json.loads(line)["seq"] <= up_to_seq]
        if lines:
            (target / path.name).write_bytes(b"".join(line + b"\n" for line in lines))


def test_a_log_that_cannot_be_written_stops_new_decisions_but_not_the_devices(audited: Audited) -> None:
    ns = audited.namespace
    pid = audited.controller.pid
    operator = f"system:serviceaccount:{ns}:operator"
    power = hardware(audited, "lamp-a").get("power")
    spec = {"device": "lamp-a", "actuator": "power", "action": "set_state", "params": {"value": not power},
            "reason": "audit test", "requester": operator}
    # The file size limit of the controller process itself, at the log's current size: root ignores file
    # permissions, not this. Its own output goes to a file too, so its log lines of the outage are lost.
    newest = log_files(audited.controller.audit_dir)[-1]
    subprocess.run(["prlimit", f"--pid={pid}", f"--fsize={newest.stat().st_size}:"], check=True)
    try:
        assert submit(audited.operator, ns, "while-unwritable", spec).code == "CREATED"
        objects = kubernetes.client.CustomObjectsApi(audited.admin)

        def waiting() -> dict[str, Any] | None:
            status = objects.get_namespaced_custom_object(GROUP, VERSION, ns, "intents", "while-unwritable") \
                .get("status") or {}
            return next((c for c in status.get("conditions") or [] if c["type"] == "AuditLogWritable"), None)

        condition = wait_for(waiting, "the Intent to say it waits for the audit log", timeout_s=30)
        assert condition["status"] == "False" and condition["reason"] == "AuditLogUnwritable"
        assert "File too large" in condition["message"], condition["message"]
        # Existing targets are still driven: a person's target reaches the hardware meanwhile.
        set_target(audited.admin, ns, "lamp-b", {"brightness": 37})
        wait_for(lambda: hardware(audited, "lamp-b").get("brightness") == 37, "lamp-b driven to 37", timeout_s=30)
        status = objects.get_namespaced_custom_object(GROUP, VERSION, ns, "intents", "while-unwritable")["status"]
        assert status.get("phase") == "Pending" and not status.get("code")
        assert hardware(audited, "lamp-a").get("power") == power, "executed while the log could not be written"
    finally:
        subprocess.run(["prlimit", f"--pid={pid}", "--fsize=unlimited:"], check=True)
    wait_for(lambda: (objects.get_namespaced_custom_object(GROUP, VERSION, ns, "intents", "while-unwritable")
                      .get("status") or {}).get("code") == "EXECUTED", "the Intent executed afterwards", timeout_s=30)
    records = audited.records()
    kinds = Counter(r.kind for r in records)
    assert kinds["audit.recovered"] >= 1 and kinds["audit.lost"] == 0
    # Nothing skipped: the command that drove lamp-b during the outage is on record too.
    assert any(r.kind == "command.sent" and r.data.get("actuator") == "brightness" and r.data.get("value") == 37
               for r in records)
    assert [r.kind for r in records if r.subject == f"{ns}/while-unwritable"] == ["intent.executing",
                                                                                "intent.decided"]
    assert "OK:" in audited.verify()


def test_the_audit_endpoint_answers_only_those_rbac_lets_read_it(audited: Audited, tmp_path: Path) -> None:
    ns, controller = audited.namespace, audited.controller
    spec = {"device": "lamp-a", "actuator": "power", "action": "set_state", "params": {"value": False},
            "reason": "audit test", "requester": f"system:serviceaccount:{ns}:operator"}
    assert submit(audited.operator, ns, "read-me", spec).code == "CREATED"
    wait_for(lambda: any(r.kind == "intent.decided" and r.subject == f"{ns}/read-me" for r in audited.records()),
             "its decision on record", timeout_s=30)
    reader = service_account_token(audited.admin, ns, "operator")
    status, body = fetch(controller, "/audit/v1/records", reader)
    assert status == 403 and "may not read the audit log" in body and "'audit'" in body
    assert fetch(controller, "/audit/v1/records", "not-a-token")[0] == 401
    assert fetch(controller, "/audit/v1/records", None)[0] == 401
    apply_yaml(audited.admin, READER_ROLE.format(namespace=ns), ns)
    wait_for(lambda: fetch(controller, f"/audit/v1/records?namespace={ns}", reader)[0] == 200,
             "the Role to take effect", timeout_s=15)
    _, body = fetch(controller, f"/audit/v1/records?namespace={ns}&intent=read-me", reader)
    records = [AuditRecord.model_validate_json(line) for line in body.splitlines()]
    assert records and all(r.subject == f"{ns}/read-me" for r in records)
    assert fetch(controller, "/audit/v1/log", reader)[0] == 403  # the whole log needs the verb cluster-wide
    admin = audited.plane.admin_token
    write_private(tmp_path / "token", admin)  # by file: a token in the arguments is readable by every local account
    shown = CliRunner().invoke(cli, ["audit", "show", "--server", controller.serve_url, "--ca-file",
                                     str(controller.serve_ca), "--token-file", str(tmp_path / "token"),
                                     "--intent", "read-me", "-o", "json"])
    assert shown.exit_code == 0, shown.output
    assert [json.loads(line)["kind"] for line in shown.output.splitlines()][-1] == "intent.decided"
    wait_for(lambda: checkpoint_covers(audited), "a published checkpoint", timeout_s=30)
    verified = CliRunner().invoke(cli, [
        "audit", "verify", "--server", controller.serve_url, "--ca-file", str(controller.serve_ca), "--token", admin,
        "--key", str(controller.audit_dir / "controller.pub.pem"),
        "--checkpoint-object", f"{ns}/corral-controller"], env={"KUBECONFIG": str(audited.plane.kubeconfig)})
    assert verified.exit_code == 0, verified.output
    assert "checkpoint" in verified.output and "covers seq" in verified.output


READER_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: audit-reader}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], verbs: [audit]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: audit-reader}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: audit-reader}}
subjects: [{{kind: ServiceAccount, name: operator, namespace: {namespace}}}]
"""


def checkpoint_covers(audited: Audited) -> bool:
    try:
        body = kubernetes.client.CustomObjectsApi(audited.admin).get_namespaced_custom_object(
            GROUP, VERSION, audited.namespace, "auditcheckpoints", "corral-controller")
    except kubernetes.client.ApiException:
        return False
    return bool((body.get("spec") or {}).get("seq"))


def fetch(controller: ControllerProcess, path: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=str(controller.serve_ca))
    try:
        with urllib.request.urlopen(urllib.request.Request(controller.serve_url + path, headers=headers),
                                    context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def hardware(audited: Audited, name: str) -> dict[str, Any]:
    device_id = device(audited.admin, audited.namespace, name)["spec"]["deviceId"]
    return on_fleet(audited.fleet, lambda: audited.fleet.devices[device_id].firmware.state())



