"""Exclusive control end to end: two agents and a person around one air conditioner, real API server and broker.

A lease is taken and given back through Intents (acquire, release, break); only the controller writes the
`coordination.k8s.io` Lease. Agent A acts through an MCP gateway over stdio (one session: its leases end with
it); agent B both through one and with Intents of its own.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.api.lease import lease_name
from corral.audit.log import read_records
from corral.client.intents import submit
from corral.decide.leases import parse
from corral.devcluster.files import DEV_USER
from corral.devcluster.plane import Plane
from tests.controller_harness import CORRAL, ControllerProcess, device, set_target
from tests.fleet_harness import running_fleet
from tests.gateway_harness import (
    HttpGateway,
    capabilities_readable,
    grant_agent,
    http_client,
    kubeconfig_for,
    stdio_client,
)
from tests.harness import (
    api_client,
    fresh_namespace,
    grant,
    kubectl,
    person_user,
    token_of,
    wait_for,
    wait_until_allowed,
)

pytestmark = pytest.mark.integration

AC = "bedroom-ac"
README = Path(__file__).resolve().parents[2] / "README.md"
REPO = README.parent


@dataclass
class Bedroom:
    plane: Plane
    namespace: str
    admin: kubernetes.client.ApiClient
    kubeconfigs: dict[str, Path]
    agent_b: kubernetes.client.ApiClient
    controller: ControllerProcess
    tokens: dict[str, str]

    def user(self, who: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{who}"

    def ask(self, who_client: kubernetes.client.ApiClient, who: str, action: str = "set_value", value: Any = 21,
            holder: str | None = None) -> dict[str, Any]:
        """An Intent of `who` on the air conditioner, once it is final."""
        name = f"{who}-{uuid.uuid4().hex[:8]}"
        lease_action = action in ("acquire", "release", "break")
        spec: dict[str, Any] = {"device": AC, "actuator": "lease" if lease_action else "target_temp",
                                "action": action, "reason": "test", "requester": self.user(who)}
        if value is not None:
            spec["params"] = {"value": value}
        if holder:
            spec["holderId"] = holder
        assert submit(who_client, self.namespace, name, spec).code == "CREATED"

        def final() -> dict[str, Any] | None:
            intent = kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "intents", name)
            status = intent.get("status") or {}
            return status if status.get("phase") in FINAL_PHASES else None
        return wait_for(final, f"Intent {name} to be decided", timeout_s=20)

    def lease(self) -> dict[str, Any] | None:
        try:
            return self.admin.sanitize_for_serialization(kubernetes.client.CoordinationV1Api(
                self.admin).read_namespaced_lease(lease_name(AC), self.namespace))
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                return None
            raise


@pytest.fixture(scope="module")
def bedroom(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Bedroom]:
    logs = tmp_path_factory.mktemp("leases")
    prefix = f"lse-{uuid.uuid4().hex[:8]}"
    with fresh_namespace(corral_api, "leases") as namespace:
        tokens = {who: grant_agent(plane, corral_api, namespace, who) for who in ("agent-a", "agent-b")}
        # A person who may approve on the device: the one who may break a lease.
        tokens["parent"] = token_of(grant(plane, corral_api, namespace, "parent", "[get, list, read, approve]", "[get]",
                                          "approve", person=True))
        kubeconfigs = {who: kubeconfig_for(plane, token, logs / f"{who}.kubeconfig", namespace)
                       for who, token in tokens.items()}
        with capabilities_readable(corral_api, namespace, "agent-a", "agent-b"), \
                running_fleet(plane, prefix, {AC: "thermostat"}, enroll_in=(corral_api, namespace)):
            controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log")
            controller.start()
            try:
                wait_for(lambda: (device(corral_api, namespace, AC).get("status") or {}).get("inSync"),
                         "the air conditioner registered", timeout_s=30)
                yield Bedroom(plane, namespace, corral_api, kubeconfigs, api_client(plane, token=tokens["agent-b"]),
                              controller, tokens)
            finally:
                controller.stop()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 90))


def test_while_a_holds_the_lease_b_is_refused_naming_a_and_cannot_touch_the_lease_object(bedroom: Bedroom) -> None:
    async def scenario() -> None:
        async with stdio_client(bedroom.kubeconfigs["agent-a"]) as a, stdio_client(bedroom.kubeconfigs["agent-b"]) as b:
            taken = await a.call_tool("iot.acquire", {"device_id": f"{bedroom.namespace}/{AC}", "reason": "cooling "
                                                                                                         "the nursery"})
            assert not taken.is_error and taken.structured_content["code"] == "EXECUTED", taken.structured_content
            control = {"device_id": f"{bedroom.namespace}/{AC}", "actuator": "target_temp", "action": "set_value",
                       "params": {"value": 20}, "reason": "too warm"}
            refused = await b.call_tool("iot.control", control)
            assert refused.structured_content["code"] == "DENY_LEASED"  # the controller's decision, as ever
            assert bedroom.user("agent-a") in refused.structured_content["message"]
            assert "cooling the nursery" in refused.structured_content["message"]
            # B has no rights on the Lease object: neither deleting nor editing it gets past RBAC.
            for verb in (["delete"], ["annotate", "--overwrite"]):
                extra = ["corral.dev/holder=me"] if verb[0] == "annotate" else []
                done = subprocess.run(
                    [str(bedroom.plane.kubectl), f"--kubeconfig={bedroom.kubeconfigs['agent-b']}", *verb,
                     "lease", lease_name(AC), "-n", bedroom.namespace, *extra], capture_output=True, text=True)
                assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
            shown = kubectl(bedroom.plane, "get", "leases", "-n", bedroom.namespace, "-o", "wide").stdout
            assert lease_name(AC) in shown and bedroom.user("agent-a") in shown  # HOLDER: the agent and its session
            mine = await a.call_tool("iot.control", {**control, "params": {"value": 19}})
            assert mine.structured_content["code"] == "EXECUTED", mine.structured_content
            released = await a.call_tool("iot.release", {"device_id": f"{bedroom.namespace}/{AC}"})
            assert released.structured_content["code"] == "EXECUTED"
            after = await b.call_tool("iot.control", control)
            assert after.structured_content["code"] == "EXECUTED", after.structured_content
    run(scenario())


def test_two_holders_under_one_identity_do_not_share_a_lease_and_an_idle_one_expires(bedroom: Bedroom) -> None:
    b = bedroom.agent_b
    assert bedroom.ask(b, "agent-b", "acquire", 4, holder="loop-1")["code"] == "EXECUTED"
    other = bedroom.ask(b, "agent-b", holder="loop-2")
    assert other["code"] == "DENY_LEASED" and "holder loop-1" in other["message"]
    # A call of the holder renews it: the idle TTL starts again from there.
    before = parse(bedroom.lease() or {})[0]
    assert bedroom.ask(b, "agent-b", value=22, holder="loop-1")["code"] == "EXECUTED"
    renewed = parse(bedroom.lease() or {})[0]
    assert before is not None and renewed is not None and renewed.expires_at > before.expires_at
    assert bedroom.ask(b, "agent-b", holder="loop-2")["code"] == "DENY_LEASED"
    # Idle for longer than its TTL: it holds nothing any more, and the controller removes it.
    wait_for(lambda: datetime.now(UTC) > renewed.expires_at, "the lease's idle TTL to pass", timeout_s=10)
    assert bedroom.ask(b, "agent-b", value=23, holder="loop-2")["code"] == "EXECUTED"
    wait_for(lambda: bedroom.lease() is None, "the expired Lease deleted", timeout_s=15)


def test_a_closed_stdio_session_gives_its_lease_back_and_a_restarted_controller_keeps_one(bedroom: Bedroom) -> None:
    b = bedroom.agent_b

    async def session() -> None:
        async with stdio_client(bedroom.kubeconfigs["agent-a"]) as a:
            taken = await a.call_tool("iot.acquire", {"device_id": f"{bedroom.namespace}/{AC}", "reason": "a while"})
            assert taken.structured_content["code"] == "EXECUTED"
    run(session())
    wait_for(lambda: bedroom.lease() is None or parse(bedroom.lease() or {})[0] is None,
             "the session's lease to end", timeout_s=10)
    assert bedroom.ask(b, "agent-b", value=24)["code"] == "EXECUTED"

    assert bedroom.ask(b, "agent-b", "acquire", 600, holder="keeper")["code"] == "EXECUTED"
    bedroom.controller.kill()
    bedroom.controller.start()
    other = bedroom.ask(api_client(bedroom.plane, token=token_of(b)), "agent-b", holder="someone-else")
    assert other["code"] == "DENY_LEASED" and "holder keeper" in other["message"]
    assert bedroom.ask(b, "agent-b", "release", None, holder="keeper")["code"] == "EXECUTED"


def test_a_person_breaks_a_lease_the_holder_is_told_by_whom_and_why_and_the_log_has_it(bedroom: Bedroom) -> None:
    b = bedroom.agent_b
    assert bedroom.ask(b, "agent-b", "acquire", 600, holder="stubborn")["code"] == "EXECUTED"
    broke = subprocess.run([CORRAL, "lease", "break", AC, "--reason", "the baby is cold", "-n", bedroom.namespace,
                            "--kubeconfig", str(bedroom.kubeconfigs["parent"])], capture_output=True, text=True,
                           timeout=60)
    assert broke.returncode == 0, broke.stderr
    assert "is broken: the baby is cold" in broke.stdout
    assert bedroom.ask(b, "agent-b", value=25)["code"] == "EXECUTED"  # someone else: the device is free
    told = bedroom.ask(b, "agent-b", value=26, holder="stubborn")
    assert told["code"] == "DENY_LEASED" and "was broken by" in told["message"] and "the baby is cold" in told["message"]
    records = wait_for(lambda: [r for r in read_records(bedroom.controller.audit_dir) if r.kind == "lease.broken"],
                       "the break on record")
    assert records[-1].data["reason"] == "the baby is cold" and records[-1].data["holderId"] == "stubborn"
    assert records[-1].data["by"] == person_user(bedroom.namespace, "parent")


def readme_lease_break(namespace: str) -> list[str]:
    """The README's own `corral lease break` line (section "Exclusive control: leases"), in this test's namespace."""
    line = next(line for line in README.read_text().splitlines() if "corral lease break" in line)
    words = shlex.split(line.split("#", 1)[0])
    assert words[0] == ".venv/bin/corral" and words[words.index("-n") + 1] == "home", line
    words[words.index("-n") + 1] = namespace
    return [CORRAL, *words[1:]]


def test_an_approver_breaks_a_lease_with_the_readmes_command_and_one_without_approve_cannot(
        bedroom: Bedroom) -> None:
    """The dev user, an approver by examples/rbac/dev-users.yaml, as the README has it (that role used to lack
    `create` on intents: 403). The attack beside it: an agent with write but no approve."""
    b = bedroom.agent_b
    assert bedroom.ask(b, "agent-b", "acquire", 600, holder="readme")["code"] == "EXECUTED"
    agent_a = api_client(bedroom.plane, token=bedroom.tokens["agent-a"])
    refused = bedroom.ask(agent_a, "agent-a", "break", None)
    assert refused["code"] == "DENY_SCOPE" and "approve" in refused["message"], refused
    assert (bedroom.lease() or {}).get("spec", {}).get("holderIdentity", "").endswith("/readme"), "still held"

    kubectl(bedroom.plane, "apply", "-n", bedroom.namespace, "-f", str(REPO / "examples" / "rbac" / "dev-users.yaml"))
    wait_until_allowed(api_client(bedroom.plane, token=bedroom.plane.user_token), "create", bedroom.namespace,
                       "intents")
    broke = subprocess.run(readme_lease_break(bedroom.namespace), capture_output=True, text=True, timeout=60,
                           env={**os.environ, "KUBECONFIG": str(bedroom.plane.kubeconfig)})
    assert broke.returncode == 0, broke.stdout + broke.stderr
    assert "is broken: I am using it" in broke.stdout, broke.stdout
    told = bedroom.ask(b, "agent-b", value=24, holder="readme")
    assert told["code"] == "DENY_LEASED" and "was broken by corral-dev-user" in told["message"], told
    records = wait_for(lambda: [r for r in read_records(bedroom.controller.audit_dir) if r.kind == "lease.broken"
                                and r.data.get("holderId") == "readme"], "the break on record")
    assert records[-1].data["by"] == DEV_USER and records[-1].data["reason"] == "I am using it"


def test_a_target_a_person_applies_to_a_leased_device_waits_for_the_lease_to_end(bedroom: Bedroom) -> None:
    b = bedroom.agent_b
    assert bedroom.ask(b, "agent-b", "acquire", 600, holder="busy")["code"] == "EXECUTED"
    set_target(bedroom.admin, bedroom.namespace, AC, {"fan_speed": "high"})

    def condition() -> dict[str, Any] | None:
        status = device(bedroom.admin, bedroom.namespace, AC).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == "Leased"), None)
    held = wait_for(lambda: (c := condition()) and c["status"] == "True" and c, "the target held for the lease")
    assert "fan_speed" in held["message"] and "holder busy" in held["message"]
    assert (device(bedroom.admin, bedroom.namespace, AC).get("status") or {}).get("reported", {}).get(
        "fan_speed") != "high"
    assert bedroom.ask(b, "agent-b", "release", None, holder="busy")["code"] == "EXECUTED"
    wait_for(lambda: (device(bedroom.admin, bedroom.namespace, AC).get("status") or {}).get("reported", {}).get(
        "fan_speed") == "high", "the held target driven once the lease ended", timeout_s=15)
    assert (condition() or {}).get("status") == "False"


def test_a_handshake_era_http_session_that_ends_gives_its_lease_back(bedroom: Bedroom, tmp_path: Path) -> None:
    gateway = HttpGateway(bedroom.plane, bedroom.namespace, tmp_path / "gateway.log")
    try:
        async def session() -> str:
            async with http_client(gateway.url, bedroom.tokens["agent-a"], mode="legacy") as a:
                taken = await a.call_tool("iot.acquire", {"device_id": f"{bedroom.namespace}/{AC}", "reason": "http"})
                assert taken.structured_content["code"] == "EXECUTED", taken.structured_content
                return str(taken.structured_content["holder"])
        holder = run(session())  # the client ends its session (DELETE) on the way out
        assert holder.startswith("mcp-")
        wait_for(lambda: bedroom.lease() is None or parse(bedroom.lease() or {})[0] is None,
                 "the HTTP session's lease to end with it", timeout_s=10)
    finally:
        gateway.stop()
