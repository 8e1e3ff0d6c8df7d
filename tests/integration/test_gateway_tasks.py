"""The MCP tasks extension (SEP-2663) end to end: the official MCP client over Streamable HTTP (protocol
2026-07-28) declares `io.modelcontextprotocol/tasks`, and an iot.control that waits for a person answers with a
task whose id is the Intent. Real kube-apiserver, broker, controller and simulated locks.

The SDK has no tasks runtime, so the client side is what an SDK user writes: a ClientExtension that claims the
`resultType: "task"` result of tools/call, and raw `tasks/get|update|cancel` requests through the SDK session.

Identities: `agent` and `intruder` (both the chart's agent-operator rules, so both may read every Intent) and a
person, a ServiceAccount in the people namespace, who approves.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import kubernetes
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, TypeAdapter

from corral.api.codes import GROUP, PEOPLE_NAMESPACE, VERSION
from corral.audit.log import read_records
from corral.client.intents import decide_on
from corral.devcluster.plane import Plane
from corral.gateway.tasks import APPROVAL_PAGE_KEY, EXTENSION
from tests.controller_harness import device, running_controller
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import MODERN, HttpGateway, capabilities_readable, grant_agent, http_client
from tests.harness import (
    api_client,
    bind_approver,
    fresh_namespace,
    service_account_token,
    wait_for,
    wait_until_allowed,
)

pytestmark = pytest.mark.integration

# Device ids are broker accounts on the session's one broker: ids of their own keep these locks apart from
# any other fleet that runs at the same time.
FRONT, BACK = (f"{side}-lock-{uuid.uuid4().hex[:6]}" for side in ("front", "back"))
FLEET = {FRONT: "lock", BACK: "lock"}
CONSOLE = "https://console.corral.example"


# ---- the client side of the extension ---------------------------------------------------------------------------

class TaskCreated(types.Result):
    """SEP-2663 CreateTaskResult: `Result & Task` with `resultType: "task"`."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskCall(types.Request[dict[str, Any], str]):
    name_param = "taskId"  # SEP-2663: tasks/* carry the task id in the Mcp-Name header


ANY = TypeAdapter(dict[str, Any])
TERMINAL = ("completed", "failed", "cancelled")


async def task_call(client: Client, method: str, task_id: str, **params: Any) -> dict[str, Any]:
    return await client.session.send_request(TaskCall(method=method, params={"taskId": task_id, **params}), ANY)


async def poll(client: Client, task_id: str, until: tuple[str, ...] = TERMINAL, timeout_s: float = 20) -> dict[str, Any]:
    """tasks/get at the task's own pollIntervalMs until its status is one of `until`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await task_call(client, "tasks/get", task_id)
        if got["status"] in until:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} never reached {until}: {got}")
        await asyncio.sleep(got.get("pollIntervalMs", 1000) / 1000)


class Tasks(ClientExtension):
    """The tasks extension as a client declares it; a plain `client.call_tool` would poll to the final result."""

    identifier = EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        async def resolve(created: TaskCreated, ctx: ClaimContext) -> types.CallToolResult:
            raise NotImplementedError("the tests drive tasks/get themselves")

        return [ResultClaim(result_type="task", model=TaskCreated, resolve=resolve)]


async def _never_asked(context: Any, params: Any) -> types.ElicitResult:
    raise AssertionError("the gateway never sends elicitation requests of its own")


@asynccontextmanager
async def tasks_client(url: str, token: str, *, url_elicitation: bool = True) -> AsyncIterator[Client]:
    """A 2026-07-28 client declaring the tasks extension (and URL-mode elicitation, which an elicitation callback
    makes the SDK declare)."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http), mode=MODERN, extensions=[Tasks()],
                            elicitation_callback=_never_asked if url_elicitation else None, cache=None) as client:
        yield client


def control(device_id: str, value: Any, request_id: str) -> dict[str, Any]:
    return {"device_id": device_id, "actuator": "locked", "action": "set_state", "params": {"value": value},
            "reason": "test", "request_id": request_id}


# ---- the home ---------------------------------------------------------------------------------------------------

@dataclass
class Home:
    plane: Plane
    namespace: str
    admin: kubernetes.client.ApiClient
    fleet: Any
    agent: str
    intruder: str
    person: kubernetes.client.ApiClient
    gateway: HttpGateway
    audit_dir: Path

    def intent(self, name: str) -> dict[str, Any]:
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "intents", name)

    def applies(self, device_id: str) -> list[tuple[str, Any]]:
        return hardware_applies(self.fleet, device_id)


def _a_person(plane: Plane, admin: kubernetes.client.ApiClient, namespace: str, name: str) -> kubernetes.client.ApiClient:
    """A ServiceAccount in the people namespace (made if missing, never deleted) with the approver rules here."""
    core = kubernetes.client.CoreV1Api(admin)
    try:
        core.create_namespace({"metadata": {"name": PEOPLE_NAMESPACE}})
    except kubernetes.client.ApiException as err:
        if err.status != 409:
            raise
    bind_approver(admin, namespace, name)
    person = api_client(plane, token=service_account_token(admin, PEOPLE_NAMESPACE, name))
    wait_until_allowed(person, "approve", namespace, "devices")
    return person


@pytest.fixture(scope="module")
def home(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Home]:
    tmp = tmp_path_factory.mktemp("gateway-tasks")
    person_name = f"person-{uuid.uuid4().hex[:6]}"
    with fresh_namespace(corral_api, "gateway-tasks") as namespace:
        agent = grant_agent(plane, corral_api, namespace, "agent")
        intruder = grant_agent(plane, corral_api, namespace, "intruder")
        person = _a_person(plane, corral_api, namespace, person_name)
        prefix = f"gt-{uuid.uuid4().hex[:8]}"
        gateway: HttpGateway | None = None
        try:
            with capabilities_readable(corral_api, namespace, "agent", "intruder"), \
                    running_fleet(plane, prefix, FLEET, enroll_in=(corral_api, namespace)) as fleet, \
                    running_controller(plane, namespace, prefix, tmp, "--intent-timeout", "4",
                                       "--approval-window", "60"):
                wait_for(lambda: all((device(corral_api, namespace, d).get("status") or {}).get("inSync")
                                     for d in FLEET), "both locks registered and in sync", timeout_s=30)
                gateway = HttpGateway(plane, namespace, tmp / "gateway.log", "--console-url", CONSOLE,
                                      "--audit-dir", str(tmp / "gateway-audit"))
                try:
                    yield Home(plane, namespace, corral_api, fleet, agent, intruder, person, gateway,
                               tmp / "gateway-audit")
                finally:
                    gateway.proc.terminate()  # it shuts down while the controller and the fleet do
        finally:
            if gateway is not None:
                gateway.stop()
            kubernetes.client.CoreV1Api(corral_api).delete_namespaced_service_account(person_name, PEOPLE_NAMESPACE)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def refused_as_missing(err: pytest.ExceptionInfo[MCPError], task_id: str, missing_err: MCPError) -> None:
    """The error for someone else's task is exactly the error for a task that does not exist."""
    assert err.value.error.code == missing_err.error.code == types.INVALID_PARAMS
    assert err.value.error.message.replace(task_id, "X") == missing_err.error.message.replace(
        f"{task_id}-nonexistent", "X")
    assert err.value.error.data == missing_err.error.data


# ---- the tests --------------------------------------------------------------------------------------------------

def test_a_high_risk_call_becomes_a_task_that_completes_after_a_person_approves_and_is_only_its_requesters(
        home: Home) -> None:
    request_id = f"lock-{uuid.uuid4().hex[:6]}"
    task_id = f"{home.namespace}/{request_id}"

    async def scenario() -> dict[str, Any]:
        async with tasks_client(home.gateway.url, home.agent) as agent, \
                tasks_client(home.gateway.url, home.intruder) as intruder:
            created = await agent.session.call_tool("iot.control", control(FRONT, True, request_id),
                                                    allow_claimed=True)
            assert isinstance(created, TaskCreated), created
            assert (created.task_id, created.status, created.ttl_ms) == (task_id, "working", None)
            assert created.poll_interval_ms and created.created_at and "approve" in (created.status_message or "")
            discovered = await agent.session.send_discover(MODERN)
            assert discovered["capabilities"]["extensions"] == {EXTENSION: {}}, "advertised in server/discover"
            # The same request again is the same Intent (DEDUP), so the same task.
            repeated = await agent.session.call_tool("iot.control", control(FRONT, True, request_id),
                                                     allow_claimed=True)
            assert isinstance(repeated, TaskCreated) and repeated.task_id == task_id, repeated

            # The person at the client is offered the approval page, as a URL-mode elicitation only.
            waiting = await task_call(agent, "tasks/get", task_id)
            assert waiting["resultType"] == "complete" and waiting["status"] == "input_required", waiting
            offer = waiting["inputRequests"][APPROVAL_PAGE_KEY]
            assert offer["method"] == "elicitation/create" and offer["params"]["mode"] == "url"
            assert offer["params"]["url"] == f"{CONSOLE}/intents/{home.namespace}/{request_id}"

            # Another caller (who may read the Intent in Kubernetes) cannot poll, answer or cancel the task:
            # answered exactly as for a task that does not exist.
            assert home.intent(request_id)["spec"]["requester"].endswith(":agent")
            kubernetes.client.CustomObjectsApi(api_client(home.plane, token=home.intruder)).get_namespaced_custom_object(
                GROUP, VERSION, home.namespace, "intents", request_id)
            with pytest.raises(MCPError) as missing:
                await task_call(intruder, "tasks/get", f"{task_id}-nonexistent")
            for method, extra in (("tasks/get", {}), ("tasks/cancel", {}),
                                  ("tasks/update", {"inputResponses": {APPROVAL_PAGE_KEY: {"action": "accept"}}})):
                with pytest.raises(MCPError) as refused:
                    await task_call(intruder, method, task_id, **extra)
                refused_as_missing(refused, task_id, missing.value)

            # Accepting the page approves nothing: the Intent still waits, and the page is not offered again.
            ack = await task_call(agent, "tasks/update", task_id,
                                  inputResponses={APPROVAL_PAGE_KEY: {"action": "accept"}})
            assert ack.get("resultType") == "complete" and set(ack) <= {"resultType", "_meta"}, ack
            again = await task_call(agent, "tasks/get", task_id)
            assert again["status"] == "working" and "inputRequests" not in again, again
            assert home.intent(request_id)["status"]["phase"] == "AwaitingApproval"
            assert home.applies(FRONT).count(("locked", True)) == 0

            await asyncio.to_thread(decide_on, home.person, home.namespace, request_id, "Approve", "going out")
            return await poll(agent, task_id)

    done = run(scenario())
    assert done["status"] == "completed", done
    result = done["result"]
    assert result["isError"] is False and result["structuredContent"]["code"] == "EXECUTED", result
    assert result["structuredContent"]["after"]["locked"] is True
    assert result["structuredContent"]["intent"] == task_id
    assert home.applies(FRONT).count(("locked", True)) == 1
    refusals = wait_for(lambda: [r for r in read_records(home.audit_dir) if r.kind == "gateway.refused"
                                 and r.data["tool"].startswith("tasks/")] or None,
                        "the intruder's refusals on record", timeout_s=10)
    assert sorted({r.data["tool"] for r in refusals}) == ["tasks/cancel", "tasks/get", "tasks/update"]
    assert all(r.subject.endswith(":intruder") and r.data["code"] == "DENY_SCOPE" for r in refusals)


def test_the_requesters_cancel_ends_a_waiting_call_cancelled_with_nothing_executed(home: Home) -> None:
    request_id = f"unlock-{uuid.uuid4().hex[:6]}"
    task_id = f"{home.namespace}/{request_id}"
    before = home.applies(BACK)

    async def scenario() -> tuple[dict[str, Any], MCPError]:
        async with tasks_client(home.gateway.url, home.agent, url_elicitation=False) as agent:
            created = await agent.session.call_tool("iot.control", control(BACK, True, request_id),
                                                    allow_claimed=True)
            assert isinstance(created, TaskCreated) and created.task_id == task_id, created
            waiting = await task_call(agent, "tasks/get", task_id)
            assert waiting["status"] == "working", "no URL-mode elicitation declared: nothing is offered"
            ack = await task_call(agent, "tasks/cancel", task_id)
            assert set(ack) <= {"resultType", "_meta"}, ack
            ended = await poll(agent, task_id)
            with pytest.raises(MCPError) as too_late:
                await task_call(agent, "tasks/cancel", task_id)
            return ended, too_late.value

    ended, too_late = run(scenario())
    assert ended["status"] == "cancelled" and "result" not in ended, ended
    status = home.intent(request_id)["status"]
    assert (status["code"], status["phase"]) == ("CANCELLED", "Denied"), status
    assert "has ended" in too_late.error.message
    assert home.applies(BACK) == before, "nothing was executed"
    cancelled = wait_for(lambda: [r for r in read_records(home.audit_dir) if r.kind == "gateway.task_cancelled"]
                         or None, "the cancel on record", timeout_s=10)
    assert cancelled[0].data["task"] == task_id and cancelled[0].subject.endswith(":agent")


@pytest.mark.parametrize("mode", ["legacy", MODERN])
def test_a_client_without_the_extension_keeps_awaiting_approval(home: Home, mode: str) -> None:
    request_id = f"plain-{mode[:6]}-{uuid.uuid4().hex[:6]}"

    async def scenario() -> tuple[dict[str, Any], MCPError]:
        async with http_client(home.gateway.url, home.agent, mode=mode) as plain:
            answer = await plain.call_tool("iot.control", control(FRONT, False, request_id))
            with pytest.raises(MCPError) as undeclared:
                await task_call(plain, "tasks/get", f"{home.namespace}/{request_id}")
            return answer.structured_content or {}, undeclared.value

    answer, undeclared = run(scenario())
    assert (answer["code"], answer["phase"], answer["request_id"]) == ("AWAITING_APPROVAL", "AwaitingApproval",
                                                                       request_id)
    assert undeclared.error.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert undeclared.error.data == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
    decide_on(home.person, home.namespace, request_id, "Deny", "not now")  # nothing is left waiting
    wait_for(lambda: home.intent(request_id)["status"].get("code") == "DENIED_BY_APPROVER", "the denial")
