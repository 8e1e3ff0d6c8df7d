"""The MCP gateway end to end: the official MCP client, over stdio and HTTP, on both protocol generations,
against the real control plane, the controller and simulated firmware.

Three identities, each a ServiceAccount with its own token and Role:
- reader: may read only kitchen-light (the `read` verb is granted by resource name);
- operator: reads everything, writes (so it sees iot.control), annotates Devices (the overlay, by Intent);
- approver: approves, with `corral approve` as a person would.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from corral.api.codes import GROUP, PEOPLE_NAMESPACE, VERSION
from corral.client.intents import decide_on
from corral.devcluster.plane import Plane
from tests.controller_harness import CORRAL, ControllerProcess, device
from tests.fleet_harness import enroll_devices, hardware_applies, on_fleet, running_fleet
from tests.gateway_harness import (
    MODERN,
    MODES,
    ONE_WORKER,
    HttpGateway,
    capabilities_readable,
    gateway_token,
    http_client,
    kubeconfig_for,
    stdio_client,
)
from tests.harness import (
    api_client,
    apply_yaml,
    ensure_people_namespace,
    fresh_namespace,
    person_name,
    service_account_token,
    wait_for,
    wait_until_allowed,
)

pytestmark = pytest.mark.integration

FLEET = {"kitchen-light": "light", "front-lock": "lock", "hall-fan": "env_fan"}
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"  # the API server's audience, not the gateway's

RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: reader}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], verbs: [get, list, watch]}}
- {{apiGroups: [corral.dev], resources: [devices], resourceNames: [kitchen-light], verbs: [read, listen]}}
- {{apiGroups: [corral.dev], resources: [intents], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: operator}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], verbs: [get, list, watch, annotate, read, listen, write]}}
- {{apiGroups: [corral.dev], resources: [intents], verbs: [get, create]}}
- {{apiGroups: [events.k8s.io], resources: [events], verbs: [list]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: approver}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], verbs: [get, list, read, approve]}}
- {{apiGroups: [corral.dev], resources: [intents], verbs: [get, list]}}
- {{apiGroups: [corral.dev], resources: [approvals], verbs: [get, list, create]}}
"""

BINDINGS = """
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {who}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {who}}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {account_ns}}}]
"""

SECOND_OPERATOR = """
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: operator-b}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: operator}}
subjects: [{{kind: ServiceAccount, name: operator-b, namespace: {ns}}}]
"""


@dataclass
class Home:
    plane: Plane
    namespace: str
    fleet: Any
    admin: kubernetes.client.ApiClient
    tokens: dict[str, str]
    kubeconfigs: dict[str, Path]
    gateway: HttpGateway

    def applies(self, device_id: str) -> list[tuple[str, Any]]:
        return hardware_applies(self.fleet, device_id)

    def client_of(self, who: str) -> kubernetes.client.ApiClient:
        return api_client(self.plane, token=self.tokens[who])


class Room:
    """One namespace, its identities, controller and HTTP gateway for the module; the fleet is started anew
    whenever a test left a mark on a device, so that every test meets the home as if it were new.

    What a test may change, and how it is undone (`undo`): Intents and Approvals are deleted; a target or
    overlay written on a Device is removed; a device that was commanded or unplugged comes back as a fresh
    device (a new fleet: new firmware, new boards that have applied nothing yet, every device powered)."""

    def __init__(self, plane: Plane, admin: kubernetes.client.ApiClient, namespace: str, prefix: str,
                 passwords: dict[str, str], tokens: dict[str, str], kubeconfigs: dict[str, Path]) -> None:
        self.plane, self.admin, self.namespace, self.prefix = plane, admin, namespace, prefix
        self.passwords, self.tokens, self.kubeconfigs = passwords, tokens, kubeconfigs
        self.gateway: HttpGateway | None = None
        self._fleet = ExitStack()
        self.fleet: Any = None

    def start_fleet(self) -> None:
        # No periodic readings: a new rssi value changes a Device every few seconds, and these tests count the
        # notices of changes they make themselves.
        self.fleet = self._fleet.enter_context(running_fleet(self.plane, self.prefix, FLEET, credentials=self.passwords,
                                                             telemetry_interval_s=3600))

    def stop_fleet(self) -> None:
        self._fleet.close()

    def home(self) -> Home:
        assert self.gateway is not None
        return Home(self.plane, self.namespace, self.fleet, self.admin, self.tokens, self.kubeconfigs, self.gateway)

    def undo(self) -> None:
        objects = kubernetes.client.CustomObjectsApi(self.admin)
        for plural in ("intents", "approvals"):
            objects.delete_collection_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
        devices = {d: device(self.admin, self.namespace, d) for d in FLEET}
        marked = on_fleet(self.fleet, lambda: any(not self.fleet.devices[d].powered or self.fleet.devices[d].board.applied
                                                  for d in FLEET))
        if marked:
            self.stop_fleet()
            wait_for(lambda: all(device(self.admin, self.namespace, d)["status"].get("online") is False for d in FLEET),
                     "every device seen offline", timeout_s=30)
        for name, body in devices.items():
            written = {field: None for field in ("target", "overlay") if body["spec"].get(field)}
            if written:
                objects.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, "devices", name,
                                                       {"spec": written})
        if marked:
            self.start_fleet()
        self.settle(gateway_too=marked)

    def settle(self, gateway_too: bool) -> None:
        """Every device online, in sync and its latest spec acted on; with gateway_too, the HTTP gateway sees
        them online as well (its view follows the API server a moment later)."""
        def settled(name: str) -> bool:
            body = device(self.admin, self.namespace, name)
            status = body.get("status") or {}
            return bool(status.get("online") and status.get("inSync")
                        and status.get("observedGeneration") == body["metadata"]["generation"])

        wait_for(lambda: all(settled(d) for d in FLEET), "every device registered and in sync", timeout_s=30)
        if gateway_too:
            wait_for(self._gateway_sees_every_device_online, "the gateway to see every device online", timeout_s=30)

    def _gateway_sees_every_device_online(self) -> bool:
        assert self.gateway is not None
        gateway = self.gateway

        async def listed() -> list[dict[str, Any]]:
            async with http_client(gateway.url, self.tokens["operator"]) as agent:
                return (await agent.call_tool("iot.list_devices", {})).structured_content["devices"]

        devices = run(listed())
        return len(devices) == len(FLEET) and all(d["online"] for d in devices)


@pytest.fixture(scope="module")
def room(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Room]:
    tmp_path = tmp_path_factory.mktemp("gateway")
    with fresh_namespace(corral_api, "gateway") as namespace:
        prefix = f"gw-{uuid.uuid4().hex[:8]}"
        apply_yaml(corral_api, RBAC.format(ns=namespace), namespace)
        tokens, kubeconfigs = {}, {}
        ensure_people_namespace(corral_api)
        for who in ("reader", "operator", "approver"):
            # The approver is a person: a ServiceAccount of the people namespace (the others are programs).
            account_ns, account = (PEOPLE_NAMESPACE, person_name(namespace, who)) if who == "approver" else (namespace, who)
            apply_yaml(corral_api, BINDINGS.format(who=who, account=account, account_ns=account_ns), namespace)
            tokens[who] = gateway_token(corral_api, account_ns, account)  # for the HTTP gateway; the API server too
            kubeconfigs[who] = kubeconfig_for(plane, tokens[who], tmp_path / f"{who}.kubeconfig", namespace)
            wait_until_allowed(api_client(plane, token=tokens[who]), "get", namespace, "devices")
        with capabilities_readable(corral_api, namespace, *tokens):
            room = Room(plane, corral_api, namespace, prefix, enroll_devices(corral_api, namespace, FLEET), tokens,
                        kubeconfigs)
            room.start_fleet()
            controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log",
                                           "--intent-timeout", "4", "--approval-window", "60")
            try:
                controller.start()
                room.settle(gateway_too=False)
                room.gateway = HttpGateway(plane, namespace, tmp_path / "gateway.log")
                yield room
            finally:
                if room.gateway is not None:
                    room.gateway.stop()
                controller.stop()
                room.stop_fleet()


@pytest.fixture
def home(room: Room) -> Iterator[Home]:
    """The module's home as a new one: whatever the test changes is undone after it (Room.undo)."""
    yield room.home()
    room.undo()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def names(result: types.ListToolsResult) -> list[str]:
    return sorted(t.name for t in result.tools)


@pytest.mark.parametrize("mode", MODES)
def test_two_callers_with_different_roles_see_different_tools_and_devices_over_stdio(home: Home, mode: str) -> None:
    async def scenario() -> None:
        async with stdio_client(home.kubeconfigs["reader"], mode=mode) as reader, \
                stdio_client(home.kubeconfigs["operator"], mode=mode) as operator:
            assert names(await reader.list_tools()) == ["iot.intent_status", "iot.list_devices", "iot.query", "iot.read"]
            assert names(await operator.list_tools()) == [
                "iot.acquire", "iot.control", "iot.intent_status", "iot.list_devices", "iot.query", "iot.read",
                "iot.release", "iot.set_alias", "iot.set_location", "iot.set_note"]
            listed = await reader.call_tool("iot.query", {})
            assert [d["device_id"] for d in listed.structured_content["devices"]] == [f"{home.namespace}/kitchen-light"]
            assert [d["device_id"] for d in (await operator.call_tool("iot.list_devices", {})).structured_content[
                "devices"]] == [f"{home.namespace}/{d}" for d in sorted(FLEET)]
            hidden = await reader.call_tool("iot.query", {"device_id": f"{home.namespace}/front-lock"})
            missing = await reader.call_tool("iot.query", {"device_id": f"{home.namespace}/no-such-device"})
            assert hidden.is_error and missing.is_error
            assert hidden.content[0].text.replace("front-lock", "X") == missing.content[0].text.replace(
                "no-such-device", "X"), "a hidden device must look exactly like a missing one"
            completed = await reader.complete(types.PromptReference(name="diagnose_device"),
                                              {"name": "device_id", "value": f"{home.namespace}/"})
            assert completed.completion.values == [f"{home.namespace}/kitchen-light"]
            with pytest.raises(MCPError, match=r"Unknown tool: iot\.control"):
                await reader.call_tool("iot.control", {"device_id": "kitchen-light", "actuator": "power",
                                                       "action": "set_state", "params": {"value": True},
                                                       "reason": "not allowed"})

    run(scenario())


def control(device_id: str, actuator: str, action: str, value: Any, **extra: Any) -> dict[str, Any]:
    return {"device_id": device_id, "actuator": actuator, "action": action, "params": {"value": value},
            "reason": "test", **extra}


@pytest.mark.parametrize("mode", MODES)
def test_control_over_http_executes_once_and_a_retry_with_the_same_request_id_is_dedup(home: Home, mode: str) -> None:
    async def scenario() -> None:
        async with http_client(home.gateway.url, home.tokens["operator"], mode=mode) as agent:
            args = control("kitchen-light", "power", "set_state", True, request_id=f"lights-on-{mode[:6]}")
            first = await agent.call_tool("iot.control", args)
            assert not first.is_error, first.content
            out = first.structured_content
            assert (out["code"], out["phase"]) == ("EXECUTED", "Succeeded")
            assert out["before"]["power"] is False and out["after"]["power"] is True
            again = await agent.call_tool("iot.control", args)
            assert again.structured_content["code"] == "DEDUP"
            assert again.structured_content["after"]["power"] is True
            status = await agent.call_tool("iot.intent_status", {"request_id": args["request_id"]})
            assert status.structured_content["code"] == "EXECUTED"

    run(scenario())
    assert home.applies("kitchen-light").count(("power", True)) == 1
    intent = kubernetes.client.CustomObjectsApi(home.admin).get_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "intents", f"lights-on-{mode[:6]}")
    assert intent["spec"]["requester"] == f"system:serviceaccount:{home.namespace}:operator"


def test_arguments_outside_the_contract_are_refused_at_the_gateway_with_what_is_allowed(home: Home) -> None:
    async def scenario() -> list[types.CallToolResult]:
        async with http_client(home.gateway.url, home.tokens["operator"]) as agent:
            return [
                await agent.call_tool("iot.control", control("kitchen-light", "brightness", "set_value", 140)),
                await agent.call_tool("iot.control", control("kitchen-light", "power", "set_value", 1)),
                await agent.call_tool("iot.control", control("kitchen-light", "siren", "set_state", True)),
                await agent.call_tool("iot.control", control("kitchen-light", "power", "set_state", True,
                                                             request_id="Not A Name")),
            ]

    too_bright, wrong_action, no_siren, bad_id = run(scenario())
    assert all(r.is_error for r in (too_bright, wrong_action, no_siren, bad_id))
    assert "a number from 0 to 100" in too_bright.content[0].text
    assert "is set with action 'set_state'" in wrong_action.content[0].text
    assert "no actuator 'siren'" in no_siren.content[0].text and "power (set_state)" in no_siren.content[0].text
    assert "request_id must be" in bad_id.content[0].text
    # The one vocabulary: the code an Intent would have ended with, in structuredContent.
    assert [r.structured_content["code"] for r in (too_bright, wrong_action, no_siren, bad_id)] == [
        "DENY_ARGUMENTS", "DENY_UNKNOWN_ACTION", "DENY_UNKNOWN_ACTION", "DENY_ARGUMENTS"]
    intents = kubernetes.client.CustomObjectsApi(home.admin).list_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "intents")["items"]
    assert intents == [], "nothing refused at the gateway may become an Intent"


@pytest.mark.parametrize("mode", MODES)
def test_a_high_risk_action_awaits_approval_and_completes_after_corral_approve(home: Home, mode: str) -> None:
    async def ask() -> dict[str, Any]:
        async with stdio_client(home.kubeconfigs["operator"], mode=mode) as agent:
            result = await agent.call_tool("iot.control", control("front-lock", "locked", "set_state", True))
            return result.structured_content

    asked = run(ask())
    assert asked["code"] == "AWAITING_APPROVAL" and asked["phase"] == "AwaitingApproval"
    name = asked["intent"].split("/")[1]
    assert name == asked["request_id"] and name in asked["message"]
    assert home.applies("front-lock").count(("locked", True)) == 0
    approved = subprocess.run([CORRAL, "approve", name, "--reason", "leaving the house",
                               "--kubeconfig", str(home.kubeconfigs["approver"])],
                              capture_output=True, text=True, timeout=60)
    assert approved.returncode == 0, approved.stderr

    async def outcome() -> dict[str, Any]:
        async with http_client(home.gateway.url, home.tokens["operator"], mode=mode) as agent:
            for _ in range(100):
                result = (await agent.call_tool("iot.intent_status", {"request_id": name})).structured_content
                if result["code"] != "AWAITING_APPROVAL" and result["code"] != "PENDING":
                    return result
                await asyncio.sleep(0.2)
            raise AssertionError(f"Intent {name} never finished: {result}")

    done = run(outcome())
    assert done["code"] == "EXECUTED" and done["after"]["locked"] is True
    assert home.applies("front-lock").count(("locked", True)) == 1


def test_a_caller_waiting_for_an_approval_holds_no_thread_another_callers_50_calls_go_through(
        home: Home, tmp_path: Path) -> None:
    """With the event loop's default executor cut to one thread, caller A waits on its Intent awaiting
    approval (iot.intent_status with wait_s) while caller B's 50 iot.control calls all complete."""
    apply_yaml(home.admin, SECOND_OPERATOR.format(ns=home.namespace), home.namespace)
    rbac = kubernetes.client.RbacAuthorizationV1Api(home.admin)
    rbac.create_cluster_role_binding({  # contracts, as the fixture lets the other identities read them
        "metadata": {"name": f"{home.namespace}-capabilities-b"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": f"{home.namespace}-capabilities"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator-b", "namespace": home.namespace}]})
    b_token = gateway_token(home.admin, home.namespace, "operator-b")
    wait_until_allowed(api_client(home.plane, token=b_token), "write", home.namespace, "devices")
    gateway = HttpGateway(home.plane, home.namespace, tmp_path / "one-worker-gateway.log", "--rate-limit", "0/1",
                          command=ONE_WORKER)
    try:
        async def scenario() -> tuple[dict[str, Any], list[str], bool]:
            async with http_client(gateway.url, home.tokens["operator"], mode=MODERN) as a, \
                    http_client(gateway.url, b_token, mode=MODERN) as b:
                asked = (await a.call_tool("iot.control", control("front-lock", "locked", "set_state", True))
                         ).structured_content
                assert asked["code"] == "AWAITING_APPROVAL", asked
                waiting = asyncio.ensure_future(
                    a.call_tool("iot.intent_status", {"request_id": asked["request_id"], "wait_s": 60}))
                await asyncio.sleep(0.5)  # A is waiting inside the gateway now
                codes = []
                for i in range(50):
                    result = await asyncio.wait_for(b.call_tool(
                        "iot.control", control("kitchen-light", "power", "set_state", i % 2 == 0)), 20)
                    codes.append(result.structured_content["code"])
                a_still_waiting = not waiting.done()
                await asyncio.to_thread(decide_on, home.client_of("approver"), home.namespace, asked["request_id"],
                                        "Approve", "B is done")
                done = await asyncio.wait_for(waiting, 30)
                return done.structured_content, codes, a_still_waiting

        done, codes, a_still_waiting = run(scenario())
    finally:
        gateway.stop()
        rbac.delete_cluster_role_binding(f"{home.namespace}-capabilities-b")
    assert codes == ["EXECUTED"] * 50
    assert a_still_waiting, "A's wait lasted through all of B's calls"
    assert done["code"] == "EXECUTED" and done["after"]["locked"] is True


class Notices:
    """Notifications a handshake-era client received, by method."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    async def __call__(self, message: Any) -> None:
        inner = getattr(message, "root", message)
        method = getattr(inner, "method", None)
        if method:
            params = getattr(inner, "params", None)
            self.seen.append((method, str(getattr(params, "uri", "")) or None))

    def count(self, method: str, uri: str | None = None) -> int:
        return sum(1 for m, u in self.seen if m == method and (uri is None or u == uri))

    async def wait(self, method: str, uri: str | None = None, at_least: int = 1, timeout_s: float = 15) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count(method, uri) < at_least:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {method} {uri or ''} within {timeout_s} s; seen: {self.seen}")
            await asyncio.sleep(0.05)


def unplug(home: Home, device_id: str) -> None:
    on_fleet(home.fleet, lambda: home.fleet.power_cycle(device_id, off_s=3600))


def test_unplugging_a_device_sends_tools_list_changed_and_later_calls_are_device_gone(home: Home) -> None:
    async def scenario() -> dict[str, Any]:
        notices = Notices()
        async with stdio_client(home.kubeconfigs["operator"], on_message=notices) as agent:
            await agent.list_tools()
            unplug(home, "hall-fan")
            await notices.wait("notifications/tools/list_changed")
            listed = (await agent.call_tool("iot.list_devices", {})).structured_content["devices"]
            assert next(d for d in listed if d["device_id"].endswith("/hall-fan"))["online"] is False
            result = await agent.call_tool("iot.control", control("hall-fan", "fan", "set_level", "high"))
            return result.structured_content

    gone = run(scenario())
    assert gone["code"] == "DEVICE_GONE", gone
    assert home.applies("hall-fan").count(("fan", "high")) == 0


def test_modern_clients_hear_of_tool_list_changes_on_a_listen_stream(home: Home) -> None:
    async def scenario() -> list[Any]:
        async with http_client(home.gateway.url, home.tokens["operator"], mode=MODERN) as agent, \
                agent.listen(tools_list_changed=True) as subscription:
            unplug(home, "hall-fan")
            async with asyncio.timeout(15):
                async for event in subscription:
                    return [event]
        return []

    events = run(scenario())
    assert type(events[0]).__name__ == "ToolsListChanged"


def _set_notes(home: Home, name: str, text: str) -> None:
    kubernetes.client.CustomObjectsApi(home.admin).patch_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "devices", name, {"spec": {"overlay": {"notes": text}}})


@pytest.mark.filterwarnings("ignore:resources/subscribe is removed")  # the handshake era's own way, on purpose
def test_a_resource_subscriber_gets_the_snapshot_first_then_coalesced_updates(home: Home) -> None:
    uri = f"corral://devices/{home.namespace}/kitchen-light"

    async def scenario() -> tuple[int, int, dict[str, Any]]:
        notices = Notices()
        async with stdio_client(home.kubeconfigs["operator"], "--update-interval", "1", on_message=notices) as agent:
            await agent.subscribe_resource(uri)
            await notices.wait("notifications/resources/updated", uri)  # the snapshot: read it now
            snapshot = json.loads((await agent.read_resource(uri)).contents[0].text)
            assert snapshot["device_id"] == f"{home.namespace}/kitchen-light" and "power" in snapshot["reported"]
            before = notices.count("notifications/resources/updated", uri)
            for i in range(20):  # a flapping device: 20 changes in about a second
                await asyncio.to_thread(_set_notes, home, "kitchen-light", f"flap {i}")
            await asyncio.sleep(2.5)  # the coalesced last notice is due at most one interval after the burst
            during = notices.count("notifications/resources/updated", uri) - before
            final = json.loads((await agent.read_resource(uri)).contents[0].text)
            return before, during, final

    before, during, final = run(scenario())
    assert before == 1
    assert 1 <= during <= 4, f"20 changes must be coalesced to one notice a second, got {during}"
    assert final["notes"] == "flap 19", "the last change of a burst is never lost"


def test_a_modern_listen_stream_gets_the_snapshot_then_updates_only_for_devices_it_may_follow(home: Home) -> None:
    visible = f"corral://devices/{home.namespace}/kitchen-light"
    hidden = f"corral://devices/{home.namespace}/front-lock"

    async def scenario() -> tuple[list[str], list[str]]:
        async with http_client(home.gateway.url, home.tokens["reader"], mode=MODERN) as agent, \
                agent.listen(resource_subscriptions=[visible, hidden]) as subscription:
            uris = []
            async with asyncio.timeout(15):
                async for event in subscription:
                    uris.append(event.uri)
                    if len(uris) == 1:
                        await asyncio.to_thread(_set_notes, home, "front-lock", "hidden change")
                        await asyncio.sleep(1.5)
                        await asyncio.to_thread(_set_notes, home, "kitchen-light", "visible change")
                    else:
                        break
            return uris, list(subscription.honored.resource_subscriptions or [])

    uris, honored = run(scenario())
    assert uris == [visible, visible], "snapshot first, then the visible change; never the hidden device"
    assert hidden not in honored


def test_http_without_a_valid_token_is_401_with_protected_resource_metadata(home: Home) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    wrong_audience = service_account_token(home.admin, home.namespace, "operator", audience=API_AUDIENCE)
    for token in (None, "not-a-kubernetes-token", home.plane.user_token, wrong_audience):
        request = urllib.request.Request(home.gateway.url, body, {**headers, **(
            {"Authorization": f"Bearer {token}"} if token else {})})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
        challenge = refused.value.headers["WWW-Authenticate"]
        assert challenge.startswith("Bearer") and "resource_metadata=" in challenge
        assert "kubectl create token SA --audience corral-gateway" in json.load(refused.value)["error_description"]
    metadata_url = challenge.split('resource_metadata="')[1].split('"')[0]
    with urllib.request.urlopen(metadata_url, timeout=10) as response:
        metadata = json.load(response)
    assert metadata["resource"] == home.gateway.url
    assert metadata["authorization_servers"] == [home.plane.server + "/"] or \
        metadata["authorization_servers"] == [home.plane.server]
    forged_host = urllib.request.Request(home.gateway.url, body, {
        **headers, "Authorization": f"Bearer {home.tokens['operator']}", "Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as misdirected:
        urllib.request.urlopen(forged_host, timeout=10)
    assert misdirected.value.code in (400, 403, 421)


def test_the_overlay_tools_store_clean_text_and_the_diagnosis_prompt_walks_through_the_device(home: Home) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any], str]:
        async with http_client(home.gateway.url, home.tokens["operator"]) as agent:
            alias = await agent.call_tool("iot.set_alias", {"device_id": "kitchen-light",
                                                            "alias": "  Kitchen\x07 light\x1b[31m" + "x" * 80})
            query = await agent.call_tool("iot.query", {"device_id": "kitchen-light"})
            prompt = await agent.get_prompt("diagnose_device", {"device_id": f"{home.namespace}/kitchen-light"})
            return alias.structured_content, query.structured_content["device"], prompt.messages[1].content.text

    alias, queried, prompt = run(scenario())
    assert alias["code"] == "EXECUTED", alias
    assert alias["value"].startswith("Kitchen light[31m") and len(alias["value"]) <= 64
    stored = device(home.admin, home.namespace, "kitchen-light")["spec"]["overlay"]
    assert stored["alias"] == alias["value"]
    assert stored["alias"] == queried["alias"] or queried["alias"] == "", "the view shows it, or not yet"
    data = json.loads(prompt.split("```json\n", 1)[1].rsplit("\n```", 1)[0])  # the prompt's data block
    assert data["device"]["device_id"] == f"{home.namespace}/kitchen-light"
    assert isinstance(data["recent_events"], list), f"the Events are readable: {data['recent_events']}"


def test_corral_tools_prints_what_a_caller_would_see(home: Home) -> None:
    def tools_as(who: str) -> str:
        done = subprocess.run(
            [CORRAL, "tools", "--device", "kitchen-light", "-n", home.namespace, "--kubeconfig",
             str(home.plane.kubeconfig), "--as", f"system:serviceaccount:{home.namespace}:{who}"],
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    reader, operator = tools_as("reader"), tools_as("operator")
    assert "iot.query" in reader and "iot.control" not in reader
    assert "iot.control" in operator and "kitchen-light.power.set_state" in operator
    others = [line for line in operator.splitlines() if line.startswith(("front-lock.", "hall-fan."))]
    assert others == [], "only the device asked about: no other device's per-actuator tools"
    hidden = subprocess.run(
        [CORRAL, "tools", "--device", "front-lock", "-n", home.namespace, "--kubeconfig", str(home.plane.kubeconfig),
         "--as", f"system:serviceaccount:{home.namespace}:reader"], capture_output=True, text=True, timeout=60)
    assert hidden.returncode == 1 and "cannot see a device" in hidden.stderr


def test_a_flooding_agent_is_rate_limited_alone_and_nothing_it_floods_is_requested(
        home: Home, tmp_path: Path) -> None:
    limited = HttpGateway(home.plane, home.namespace, tmp_path / "limited.log", "--rate-limit", "3/60")
    try:
        async def flood() -> tuple[list[types.CallToolResult], types.CallToolResult]:
            async with http_client(limited.url, home.tokens["operator"]) as agent, \
                    http_client(limited.url, home.tokens["reader"]) as other:
                calls = [await agent.call_tool("iot.control", control("kitchen-light", "brightness", "set_value",
                                                                      10 * i, request_id=f"flood-{i}"))
                         for i in range(5)]
                return calls, await other.call_tool("iot.query", {"device_id": "kitchen-light"})

        calls, other = run(flood())
    finally:
        limited.stop()
    assert [c.is_error for c in calls] == [False, False, False, True, True]
    assert calls[3].content[0].text.startswith("RATE_LIMITED: at most 3 control calls per 60 s per caller")
    assert calls[3].structured_content["code"] == "RATE_LIMITED"
    assert not other.is_error, "another caller is not slowed down by the flood"
    names = {i["metadata"]["name"] for i in kubernetes.client.CustomObjectsApi(home.admin).list_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "intents")["items"]}
    assert names == {"flood-0", "flood-1", "flood-2"}


def test_an_agent_cannot_name_another_requester_through_the_gateway(home: Home) -> None:
    async def forge() -> dict[str, Any]:
        async with http_client(home.gateway.url, home.tokens["operator"]) as agent:
            result = await agent.call_tool("iot.control", {
                **control("kitchen-light", "power", "set_state", True, request_id="forged"),
                "requester": "system:admin"})
            return result.structured_content or {"error": result.content[0].text}

    run(forge())
    intent = kubernetes.client.CustomObjectsApi(home.admin).get_namespaced_custom_object(
        GROUP, VERSION, home.namespace, "intents", "forged")
    assert intent["spec"]["requester"] == f"system:serviceaccount:{home.namespace}:operator"


def test_a_stdio_gateway_that_shows_its_caller_no_devices_says_so_and_where_it_looked(
        home: Home, tmp_path: Path) -> None:
    empty = f"{home.namespace}-nothing"
    kubernetes.client.CoreV1Api(home.admin).create_namespace({"metadata": {"name": empty}})
    try:
        started = subprocess.run([CORRAL, "mcp", "--transport", "stdio", "-n", empty], input="", text=True,
                                 capture_output=True, timeout=60,
                                 env={**os.environ, "KUBECONFIG": str(home.kubeconfigs["operator"])})
        said = started.stderr

        async def connect() -> tuple[str | None, str]:
            async with stdio_client(home.kubeconfigs["operator"], "-n", empty) as agent:
                assert (await agent.list_tools()).tools == [], "nothing to act on: no tool"
                with pytest.raises(MCPError) as unknown:
                    await agent.call_tool("iot.list_devices", {})
                told = agent.session.initialize_result.instructions if agent.session.initialize_result else None
                return told, str(unknown.value)

        told, unknown = run(connect())
    finally:
        kubernetes.client.CoreV1Api(home.admin).delete_namespace(empty)
    who = f"system:serviceaccount:{home.namespace}:operator"
    assert f"{who} sees no devices in namespace(s) {empty}" in said and "-n" in said, said
    assert told is not None and f"namespace(s) {empty}" in told and "sees no devices" in told
    # What to ask the operator for, and no tool to start with: it has none.
    binding = (f"kubectl create rolebinding corral-agent-operator --clusterrole=corral-agent-operator "
               f"--serviceaccount={home.namespace}:operator -n {empty}")
    assert binding in told and "iot." not in told, told
    assert "Unknown tool: iot.list_devices" in unknown and binding in unknown, unknown
