"""The guards read models where objects enter (kube.watched): an Interlock or AgentPause its model refuses is told
on the object, never a crash, and a readable one reads the same as its body did."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from corral.api.lease import HOLDER, HOLDER_ID, REASON, LeaseObject
from corral.api.pause import AgentPause, paused_of
from corral.decide.leases import parse
from corral.kube.events import ObjectRef
from corral.reconcile.guards.interlocks import Interlocks
from corral.reconcile.guards.pauses import AgentPauses, in_force


class FakeKube:
    api = None

    def __init__(self) -> None:
        self.statuses: list[tuple[str, str, dict[str, Any]]] = []

    async def apply_status(self, plural: str, namespace: str, name: str, kind: str, status: dict[str, Any],
                           reason: str) -> dict[str, Any]:
        self.statuses.append((plural, name, status))
        return {"metadata": {"name": name, "namespace": namespace, "uid": "u-1", "resourceVersion": "9"},
                "status": status}


class FakeRecorder:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, regarding: ObjectRef, reason: str, action: str, note: str, type_: str = "Normal") -> None:
        self.posted.append((reason, type_, note))


class FakeAudit:
    def __init__(self) -> None:
        self.appended: list[tuple[str, dict[str, Any]]] = []

    async def append(self, kind: str, subject: str, data: dict[str, Any], **_: Any) -> int:
        self.appended.append((kind, dict(data)))
        return len(self.appended)

    def note(self, kind: str, subject: str, data: dict[str, Any], **_: Any) -> None:
        self.appended.append((kind, dict(data)))


class NoDevices:
    def items(self) -> list[tuple[tuple[str, str], object]]:
        return []


def test_an_interlock_its_model_refuses_guards_nothing_and_says_why_in_its_compiled_condition() -> None:
    kube, changed = FakeKube(), []
    interlocks = Interlocks(kube, NoDevices(), ("home",), on_change=changed.append)
    refused = {"apiVersion": "corral.dev/v1alpha1", "kind": "Interlock",
               "metadata": {"name": "main-water", "namespace": "home", "uid": "u-1", "resourceVersion": "5",
                            "generation": 3},
               "spec": {"condition": "true", "message": "no guards named"}}
    interlocks.on_event("ADDED", refused)  # no exception reaches the informer
    assert changed == ["home"] and ("home", "main-water") in interlocks.refused
    compiled = interlocks.rules["home"]["main-water"]
    assert not compiled.ok and "does not parse" in (compiled.error or "") and "spec.guards" in (compiled.error or "")
    asyncio.run(interlocks.reconcile(("home", "main-water")))
    (plural, name, status), = kube.statuses
    (condition,) = status["conditions"]
    assert (plural, name, condition["type"], condition["status"], condition["reason"]) == (
        "interlocks", "main-water", "Compiled", "False", "CompileError")
    assert "spec.guards" in condition["message"] and status["observedGeneration"] == 3
    interlocks.on_event("DELETED", refused)
    assert "main-water" not in interlocks.rules["home"] and not interlocks.refused


def pause_body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "AgentPause",
            "metadata": {"name": "agents", "namespace": "home", "uid": "p-1", "resourceVersion": "7", "generation": 1},
            "spec": {"paused": True, "reason": "dinner", "by": "alice", "since": "2026-11-30T12:00:00Z", **spec}}


def test_a_pause_reads_the_same_from_its_model_as_from_its_body() -> None:
    for body in (pause_body(), pause_body(paused=False), pause_body(reason="a\u202eb")):
        assert in_force(AgentPause.model_validate(body)) == paused_of(body)


def test_a_pause_its_model_refuses_still_pauses_and_is_told_as_malformed_with_nothing_acknowledged() -> None:
    kube, recorder, audit, changed = FakeKube(), FakeRecorder(), FakeAudit(), []
    pauses = AgentPauses(kube, ("home",), audit, recorder, on_change=changed.append)
    body = pause_body()
    del body["spec"]["by"]  # the API server requires it; a switch that says paused is paused all the same
    pauses.on_event("ADDED", body)
    paused = pauses.paused("home")
    assert paused is not None and paused.by == "someone" and changed == ["home"]
    asyncio.run(pauses.reconcile(("home", "agents")))
    assert [(reason, type_) for reason, type_, _note in recorder.posted] == [("Malformed", "Warning")]
    assert "spec.by" in recorder.posted[0][2] and not kube.statuses and not audit.appended


def test_a_pause_is_recorded_announced_and_acknowledged_from_its_model() -> None:
    kube, recorder, audit = FakeKube(), FakeRecorder(), FakeAudit()
    pauses = AgentPauses(kube, ("home",), audit, recorder)
    pauses.on_event("ADDED", pause_body())
    asyncio.run(pauses.reconcile(("home", "agents")))
    assert audit.appended == [("agents.paused", {"paused": True, "by": "alice", "reason": "dinner",
                                                 "since": "2026-11-30T12:00:00Z", "generation": 1})]
    assert [(reason, type_) for reason, type_, _note in recorder.posted] == [("AgentsPaused", "Warning")]
    (plural, _name, status), = kube.statuses
    assert plural == "agentpauses" and status["enforced"] is True and status["observedGeneration"] == 1


def test_a_lease_reads_the_same_from_its_model_as_from_its_body() -> None:
    body = {"metadata": {"name": "corral-lease-ac", "namespace": "home", "labels": {"corral.dev/lease": "ac"},
                         "annotations": {HOLDER: "bob", HOLDER_ID: "s-1", REASON: "cooling"}},
            "spec": {"holderIdentity": "bob/s-1", "leaseDurationSeconds": 60, "leaseTransitions": 2,
                     "renewTime": datetime(2026, 11, 30, 12, tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
    obj = LeaseObject.model_validate(body)
    assert obj.device == "ac" and parse(obj) == parse(body) and parse(body)[0] is not None
