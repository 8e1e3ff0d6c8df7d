"""The tasks extension's view of an Intent (gateway/tasks.py): how each status becomes a SEP-2663 task."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from corral.gateway import tasks

CREATED = "2026-08-01T10:00:00Z"


def intent(phase: str | None, code: str | None = None, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"namespace": "home", "name": "mcp-lock-1", "uid": "u-1", "creationTimestamp": CREATED},
        "spec": {"device": "front-lock", "actuator": "locked", "action": "set_state", "params": {"value": True},
                 "requester": "system:serviceaccount:home:agent"},
        "status": {**({"phase": phase} if phase else {}), **({"code": code} if code else {}), **status},
    }
    return body


RESULT = {"content": [{"type": "text", "text": "{}"}], "structuredContent": {"code": "EXECUTED"}, "isError": False}
URL = "https://console.example/intents/home/mcp-lock-1"


@pytest.mark.parametrize(("phase", "code", "expected"), [
    (None, None, "working"),  # the controller has not looked at it yet
    ("Pending", None, "working"),
    ("AwaitingApproval", None, "working"),
    ("Executing", None, "working"),
    ("Succeeded", "EXECUTED", "completed"),
    ("Failed", "TIMEOUT", "completed"),  # a tool result, not a JSON-RPC error: never "failed"
    ("Denied", "DENIED_BY_APPROVER", "completed"),
    ("Denied", "DENY_APPROVAL", "completed"),
    ("DryRun", "EXECUTED", "completed"),
    ("Denied", "CANCELLED", "cancelled"),
])
def test_every_intent_phase_maps_to_one_task_status(phase: str | None, code: str | None, expected: str) -> None:
    assert tasks.status_of(intent(phase, code)) == expected


def test_a_waiting_call_answers_with_a_working_task_whose_id_is_the_intent() -> None:
    created = tasks.created(intent("AwaitingApproval", approvalExpiresAt="2026-08-01T10:05:00Z"))
    assert created["resultType"] == "task"
    assert (created["taskId"], created["status"], created["createdAt"]) == ("home/mcp-lock-1", "working", CREATED)
    assert created["ttlMs"] is None and created["pollIntervalMs"] == tasks.POLL_INTERVAL_MS
    assert "corral approve mcp-lock-1 -n home" in created["statusMessage"]
    assert "2026-08-01T10:05:00Z" in created["statusMessage"]


def test_a_completed_task_carries_the_tool_result_and_a_cancelled_one_none() -> None:
    done = tasks.detailed(intent("Succeeded", "EXECUTED", decidedAt="2026-08-01T10:01:00Z"), RESULT, URL)
    assert (done["status"], done["result"], done["lastUpdatedAt"]) == ("completed", RESULT, "2026-08-01T10:01:00Z")
    assert "inputRequests" not in done, "an ended task offers nothing"
    withdrawn = tasks.detailed(intent("Denied", "CANCELLED", message="Withdrawn by the requester."), RESULT, URL)
    assert withdrawn["status"] == "cancelled" and "result" not in withdrawn
    assert withdrawn["statusMessage"] == "CANCELLED: Withdrawn by the requester."


def test_a_waiting_task_offers_the_approval_page_only_as_a_url_elicitation() -> None:
    waiting = intent("AwaitingApproval")
    assert tasks.detailed(waiting, RESULT)["status"] == "working"  # no URL to offer
    offered = tasks.detailed(waiting, RESULT, URL)
    assert offered["status"] == "input_required"
    request = offered["inputRequests"][tasks.APPROVAL_PAGE_KEY]
    assert request["method"] == "elicitation/create"
    assert request["params"]["mode"] == "url" and request["params"]["url"] == URL
    assert "requestedSchema" not in request["params"], "never a form: a form's accept is no approval"
    assert "approves nothing" in request["params"]["message"]
    types.ElicitRequestURLParams.model_validate(request["params"])
    # Executing: too late for a person; nothing is offered.
    assert tasks.detailed(intent("Executing"), RESULT, URL)["status"] == "working"


def test_last_updated_is_the_latest_transition() -> None:
    body = intent("AwaitingApproval", conditions=[
        {"type": "Decided", "lastTransitionTime": "2026-08-01T10:00:02Z"},
        {"type": "Approved", "lastTransitionTime": "2026-08-01T10:00:01Z"}])
    assert tasks.task(body)["lastUpdatedAt"] == "2026-08-01T10:00:02Z"
    assert tasks.task(intent(None))["lastUpdatedAt"] == CREATED
    # Fractions of a second count as time, not as text ("10:00:00.5Z" sorts before "10:00:00Z" as a string).
    precise = intent("Succeeded", "EXECUTED", decidedAt="2026-08-01T10:00:00.500000Z")
    assert tasks.task(precise)["lastUpdatedAt"] == "2026-08-01T10:00:00.500000Z"


def test_the_extension_counts_only_where_declared_on_the_modern_protocol() -> None:
    with_tasks = types.ClientCapabilities(extensions={tasks.EXTENSION: {}})
    assert tasks.declared("2026-07-28", with_tasks)
    assert not tasks.declared("2025-11-25", with_tasks), "SEP-2663 is not defined on the handshake era"
    assert not tasks.declared("2026-07-28", types.ClientCapabilities(extensions={"io.example/other": {}}))
    assert not tasks.declared("2026-07-28", types.ClientCapabilities())
    assert not tasks.declared("2026-07-28", None)


def test_url_elicitation_needs_the_url_mode_declared() -> None:
    assert tasks.url_elicitation(types.ClientCapabilities(elicitation=types.ElicitationCapability(
        form=types.FormElicitationCapability(), url=types.UrlElicitationCapability())))
    assert not tasks.url_elicitation(types.ClientCapabilities(elicitation=types.ElicitationCapability()))  # form only
    assert not tasks.url_elicitation(types.ClientCapabilities())
    assert not tasks.url_elicitation(None)


@pytest.mark.parametrize(("value", "parsed"), [
    ("home/mcp-lock-1", ("home", "mcp-lock-1")),
    ("mcp-lock-1", (None, "mcp-lock-1")),
    ("/mcp-lock-1", None),
    ("home/", None),
    ("a/b/c", None),
    ("", None),
    (42, None),
    ("x" * 400, None),
])
def test_task_ids(value: Any, parsed: tuple[str | None, str] | None) -> None:
    assert tasks.parse_task_id(value) == parsed


def test_the_approval_page_url() -> None:
    assert tasks.approval_page("https://console.example/", "home", "mcp-lock-1") == URL
    assert tasks.approval_page("https://h.example/corral", "a b", "c/d") == "https://h.example/corral/intents/a%20b/c%2Fd"
    assert tasks.valid_console_url("https://console.example") and tasks.valid_console_url("http://127.0.0.1:8080/x")
    assert not tasks.valid_console_url("console.example")
    assert not tasks.valid_console_url("javascript:alert(1)")
    assert not tasks.valid_console_url("https://console.example/?next=evil")
