"""The controller killed with SIGKILL at each fixed point of an executed Intent's path (issue 30).

The `Executing` status write left the critical path (the fsynced `intent.executing` record is the mark a restart
resumes from), and the Device's status write now follows the Intent's final write. Each gap between the steps
gets a kill at a fixed point (`CORRAL_CRASH_AT`, corral.obs.crashpoints): the controller is started with the
switch, dies there (exit status -9 and its own line in the log prove where), and a controller started again
without it must end the Intent exactly once: one `intent.executing` and one `intent.decided` record, EXECUTED,
the same command id in the record, the status and on the wire, the light switched once, its Device's status
telling the truth, and the audit log verifying.

One namespace, fleet (a light per step) and audit log for the module: the controller of each test is a restart
of the previous one's, as in production.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from click.testing import CliRunner

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.audit.chain import AuditRecord
from corral.audit.log import read_records
from corral.cli.main import cli
from corral.client.intents import submit
from corral.devcluster.plane import Plane
from corral.obs.crashpoints import (
    ACK_RECEIVED,
    COMMAND_SENT,
    DECIDED_RECORDED,
    ENV,
    FINAL_WRITTEN,
    STEPS,
    TARGET_APPLIED,
)
from corral_sim.fleet import Fleet
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import Watcher, hardware_applies, running_fleet
from tests.harness import fresh_namespace, grant, wait_for

pytestmark = pytest.mark.integration

LIGHTS = {step: f"lamp-{i}" for i, step in enumerate(STEPS)}


@dataclass
class Rig:
    plane: Plane
    namespace: str
    prefix: str
    admin: kubernetes.client.ApiClient
    operator: kubernetes.client.ApiClient
    fleet: Fleet
    watcher: Watcher
    log_path: Path  # one controller log and audit log (beside it) for every restart in the module

    def intent(self, name: str) -> dict[str, Any]:
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "intents", name)

    def records(self, uid: str, kind: str) -> list[AuditRecord]:
        directory = self.log_path.parent / f"{self.log_path.stem}-audit"
        return [r for r in read_records(directory) if r.uid == uid and r.kind == kind]

    def commands(self, lamp: str, since: int) -> list[dict[str, Any]]:
        """The commands that changed something (not get_state) the lamp was sent after the first `since`."""
        return [m.json() for m in self.watcher.messages(lamp, "cmd")[since:] if m.json().get("cmd") != "get_state"]

    def acks(self, lamp: str, command_id: str) -> list[dict[str, Any]]:
        return [m.json() for m in self.watcher.messages(lamp, "ack") if m.json().get("id") == command_id]


@pytest.fixture(scope="module")
def rig(plane: Plane, corral_api: kubernetes.client.ApiClient, kube: kubernetes.client.ApiClient,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with fresh_namespace(kube, "crash-points") as namespace:
        operator = grant(plane, corral_api, namespace, "operator", "[get, list, read, write]", "[get]", "write")
        prefix = f"crash-{uuid.uuid4().hex[:6]}"
        with running_fleet(plane, prefix, dict.fromkeys(LIGHTS.values(), "light"),
                           enroll_in=(corral_api, namespace)) as fleet:
            watcher = Watcher(plane, prefix)
            try:
                yield Rig(plane, namespace, prefix, corral_api, operator, fleet, watcher,
                          tmp_path_factory.mktemp("crash-points") / "controller.log")
            finally:
                watcher.close()


def started(rig: Rig, monkeypatch: pytest.MonkeyPatch, step: str | None) -> ControllerProcess:
    """The controller, with the switch set to `step` (in its environment only) or without it."""
    controller = ControllerProcess(rig.plane, rig.namespace, rig.prefix, rig.log_path)
    with monkeypatch.context() as env:
        if step is not None:
            env.setenv(ENV, step)
        else:
            env.delenv(ENV, raising=False)
        controller.start()
    return controller


def log_size(rig: Rig) -> int:
    return rig.log_path.stat().st_size if rig.log_path.exists() else 0


def at_the_kill(rig: Rig, step: str, lamp: str, uid: str, name: str, power: bool, mark: int,
                applies: int) -> str:
    """What the kill left, step by step: the proof that it happened in that gap and not another. The command id."""
    executing = rig.records(uid, "intent.executing")
    assert len(executing) == 1, f"{step}: the execution is on record (fsynced) before anything else happens"
    command_id = executing[0].data["commandId"]
    order = STEPS.index(step)
    decided = rig.records(uid, "intent.decided")
    assert len(decided) == (1 if order >= STEPS.index(DECIDED_RECORDED) else 0), (step, decided)
    status = rig.intent(name).get("status") or {}
    assert (status.get("phase") in FINAL_PHASES) == (step == FINAL_WRITTEN), (step, status)
    target = (device(rig.admin, rig.namespace, lamp)["spec"].get("target") or {}).get("power")
    assert (target == power) == (order >= STEPS.index(TARGET_APPLIED)), (step, target)
    if order >= STEPS.index(COMMAND_SENT):
        # Acked by the broker before the kill (the point waits for it), so it reaches the firmware.
        rig.watcher.wait_for(f"{step}: command {command_id} on the wire",
                             lambda: [c for c in rig.commands(lamp, mark) if c["id"] == command_id])
    else:
        assert not rig.commands(lamp, mark), f"{step}: nothing was sent before the kill"
        assert len(hardware_applies(rig.fleet, lamp)) == applies, f"{step}: the light was not switched yet"
    if order >= STEPS.index(ACK_RECEIVED):
        # The firmware's ack was out: the controller died holding it, or after it.
        rig.watcher.wait_for(f"{step}: the ack of {command_id} on the wire", lambda: rig.acks(lamp, command_id))
    return str(command_id)


@pytest.mark.parametrize("step", STEPS)
def test_a_controller_killed_at_each_step_ends_the_intent_once_with_the_same_command_id(
        rig: Rig, step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lamp = LIGHTS[step]
    requester = f"system:serviceaccount:{rig.namespace}:operator"
    name = f"crash-{step}-{uuid.uuid4().hex[:4]}"
    log_from = log_size(rig)
    controller = started(rig, monkeypatch, step)
    try:
        reported = wait_for(lambda: (s := device(rig.admin, rig.namespace, lamp).get("status") or {}).get("inSync")
                            and s.get("online") and s["reported"], f"{lamp} online and in sync", timeout_s=60)
        power = not reported.get("power")
        mark, applies = len(rig.watcher.messages(lamp, "cmd")), len(hardware_applies(rig.fleet, lamp))
        created = submit(rig.operator, rig.namespace, name, {
            "device": lamp, "actuator": "power", "action": "set_state", "params": {"value": power},
            "reason": f"crash test: {step}", "requester": requester})
        assert created.code == "CREATED", created
        uid = created.intent["metadata"]["uid"]
        assert controller.proc is not None
        wait_for(lambda: controller.proc is not None and controller.proc.poll() is not None,
                 f"the controller to die at {step}", timeout_s=30, interval_s=0.02)
        assert controller.proc.returncode == -signal.SIGKILL, controller.log_tail()
        said = rig.log_path.read_bytes()[log_from:].decode(errors="replace")
        assert [s for s in STEPS if f"crash point {s} reached" in said] == [step], controller.log_tail()
        command_id = at_the_kill(rig, step, lamp, uid, name, power, mark, applies)

        controller = started(rig, monkeypatch, None)
        done = wait_for(lambda: (s := rig.intent(name).get("status") or {}).get("phase") in FINAL_PHASES and s,
                        f"{name} final after the restart", timeout_s=60)
        wait_for(lambda: (device(rig.admin, rig.namespace, lamp).get("status") or {}).get("reported", {})
                 .get("power") is power, f"{lamp}'s status showing power={power}", timeout_s=30)
    finally:
        controller.stop()
    assert rig.log_path.read_bytes()[log_from:].count(b"crash point") == 1, "the restarted controller ran on"

    assert (done["code"], done["commandId"]) == ("EXECUTED", command_id), done
    executing, decided = rig.records(uid, "intent.executing"), rig.records(uid, "intent.decided")
    assert len(executing) == 1 and len(decided) == 1, (executing, decided)
    assert decided[0].data["code"] == "EXECUTED" and decided[0].data["commandId"] == command_id, decided[0].data
    assert done["audit"]["seq"] == decided[0].seq, "the status cites the one decision record"
    assert {c["id"] for c in rig.commands(lamp, mark)} == {command_id}, "no second command id for this Intent"
    assert hardware_applies(rig.fleet, lamp)[applies:] == [("power", power)], "the light switched exactly once"
    verified = CliRunner().invoke(cli, ["audit", "verify", "--file", str(controller.audit_dir), "--key",
                                        str(controller.audit_dir / "controller.pub.pem")])
    assert verified.exit_code == 0, verified.output
