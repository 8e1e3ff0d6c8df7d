"""Finished Intents are deleted after their retention, and a replay of the name is still answered, never run.

The real controller (`corral run --intent-retention 2`) and firmware: an Intent executes and is deleted; the
same name made again (the create succeeds: nothing is left for the client to compare with) is answered by the
controller from its audit log, DEDUP with the earlier outcome for the same request and DENY_ID_CONFLICT for
another, and nothing reaches the device. The same holds after a restart of the controller whose audit log has
rotated (`--audit-max-bytes 4096`) so that the original decision sits in a closed file, over the client path
(client.intents.submit) and over MCP (`iot.control` with the same request_id).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import GROUP, VERSION
from corral.audit.chain import AuditRecord
from corral.audit.log import log_files, read_records
from corral.client.intents import submit, wait_settled
from corral.devcluster.plane import Plane
from tests.controller_harness import ControllerProcess, device, set_target
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import capabilities_readable, grant_agent, kubeconfig_for, stdio_client
from tests.harness import grant, wait_for

pytestmark = pytest.mark.integration

LIGHT = "kept-light"


def status(intent: dict[str, Any]) -> tuple[Any, Any]:
    found = intent.get("status") or {}
    return found.get("phase"), found.get("code")


def gone(objects: kubernetes.client.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", name)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def records(controller: ControllerProcess, kind: str, subject: str) -> list[AuditRecord]:
    return [r for r in read_records(controller.audit_dir) if r.kind == kind and r.subject == subject]


def file_of(controller: ControllerProcess, record: AuditRecord) -> Path:
    """The audit file that holds the record."""
    for path in log_files(controller.audit_dir):
        if any(f'"seq":{record.seq},'.encode() in line for line in path.read_bytes().splitlines()):
            return path
    raise AssertionError(f"no audit file holds seq {record.seq}")


def test_a_deleted_intent_replayed_is_dedup_or_a_conflict_from_the_audit_log_across_restart_and_rotation(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    prefix = f"ret-{uuid.uuid4().hex[:8]}"
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    with running_fleet(plane, prefix, {LIGHT: "light"}, enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log",
                                       "--intent-retention", "2", "--audit-max-bytes", "4096")
        controller.start()
        try:
            wait_for(lambda: (device(corral_api, namespace, LIGHT).get("status") or {}).get("online"),
                     "the light online", timeout_s=30)
            operator = grant(plane, corral_api, namespace, "operator", "[get, write]", "[get]", "write")
            on = {"device": LIGHT, "actuator": "power", "action": "set_state", "params": {"value": True},
                  "reason": "evening", "requester": f"system:serviceaccount:{namespace}:operator"}
            off = {**on, "params": {"value": False}}
            name, subject = "lights-on-once", f"{namespace}/lights-on-once"

            assert submit(operator, namespace, name, on).code == "CREATED"
            first = wait_settled(operator, namespace, name, 20)
            assert status(first) == ("Succeeded", "EXECUTED"), first.get("status")
            # The positive control of every count below: one execution shows on the hardware and in the log.
            wait_for(lambda: hardware_applies(fleet, LIGHT).count(("power", True)) == 1, "the light switched on")
            assert len(records(controller, "intent.executing", subject)) == 1
            # A person switches it off again: a second execution of the same request would switch it on.
            set_target(corral_api, namespace, LIGHT, {"power": False})
            wait_for(lambda: ("power", False) in hardware_applies(fleet, LIGHT), "the person's target applied")

            def replay(spec: dict[str, Any], expected: str, reason: str) -> dict[str, Any]:
                wait_for(lambda: gone(objects, namespace, name), f"Intent {name} deleted by retention ({reason})",
                         timeout_s=20)
                made = submit(operator, namespace, name, spec)
                assert made.code == "CREATED", (reason, made)  # the client had nothing to compare: the controller answers
                answered = wait_settled(operator, namespace, name, 20)
                assert status(answered) == ("Denied", expected), (reason, answered.get("status"))
                return answered

            def never_again(reason: str) -> None:
                assert hardware_applies(fleet, LIGHT).count(("power", True)) == 1, reason
                assert len(records(controller, "intent.executing", subject)) == 1, reason

            same = replay({**on, "reason": "evening, asked again"}, "DEDUP", "the same request")
            assert same["status"]["message"].startswith("Same request as before: EXECUTED at "), same["status"]
            assert same["status"]["after"]["power"] is True  # the earlier outcome, as the client's DEDUP gave it
            never_again("a DEDUP replay executes nothing")
            other = replay(off, "DENY_ID_CONFLICT", "other content")
            assert "use a new request_id for a new request" in other["status"]["message"], other["status"]
            never_again("a conflicting replay executes nothing")
            answers = records(controller, "intent.decided", subject)
            assert [r.data["code"] for r in answers] == ["EXECUTED", "DEDUP", "DENY_ID_CONFLICT"]
            assert {r.data.get("replayOf") for r in answers[1:]} == {answers[0].uid}
            assert len({r.uid for r in answers}) == 3  # each answer is a decision of its own Intent

            # The original decision is in a closed file by now: only a read over every file finds it at start.
            wait_for(lambda: file_of(controller, answers[0]) != log_files(controller.audit_dir)[-1],
                     "the audit log rotated past the original decision", timeout_s=30)
            controller.stop()
            controller.start()
            wait_for(lambda: (device(corral_api, namespace, LIGHT).get("status") or {}).get("online"),
                     "the light online after the restart", timeout_s=30)
            replay(on, "DEDUP", "the same request after the restart")
            replay(off, "DENY_ID_CONFLICT", "other content after the restart")
            never_again("after the restart, a replay executes nothing")
            assert [r.data["code"] for r in records(controller, "intent.decided", subject)] == [
                "EXECUTED", "DEDUP", "DENY_ID_CONFLICT", "DEDUP", "DENY_ID_CONFLICT"]

            # Over MCP: iot.control with a request_id that executed once, its Intent since deleted.
            token = grant_agent(plane, corral_api, namespace)
            kubeconfig = kubeconfig_for(plane, token, tmp_path / "agent.kubeconfig", namespace)
            with capabilities_readable(corral_api, namespace, "agent"):
                mcp_subject = f"{namespace}/dim-once"
                args = {"device_id": LIGHT, "actuator": "brightness", "action": "set_value", "params": {"value": 37},
                        "reason": "reading", "request_id": "dim-once"}
                first_call = asyncio.run(call_control(kubeconfig, args))
                assert first_call["code"] == "EXECUTED", first_call
                wait_for(lambda: hardware_applies(fleet, LIGHT).count(("brightness", 37)) == 1, "the light dimmed")
                wait_for(lambda: gone(objects, namespace, "dim-once"), "the MCP Intent deleted by retention",
                         timeout_s=20)
                again = asyncio.run(call_control(kubeconfig, args))
                assert again["code"] == "DEDUP" and again["after"]["brightness"] == 37, again
                assert "Same request as before: EXECUTED at " in again["message"], again
                assert hardware_applies(fleet, LIGHT).count(("brightness", 37)) == 1
                assert len(records(controller, "intent.executing", mcp_subject)) == 1
        finally:
            controller.stop()


async def call_control(kubeconfig: Path, args: dict[str, Any]) -> dict[str, Any]:
    async with stdio_client(kubeconfig) as agent:
        result = await agent.call_tool("iot.control", args)
        assert not result.is_error, result.content  # the agent gets an answer, not an error
        assert result.structured_content is not None
        return dict(result.structured_content)
