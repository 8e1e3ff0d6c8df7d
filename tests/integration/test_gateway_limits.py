"""Per-caller bounds at the HTTP gateway (finding 2: one agent's sessions filled the SDK's global limit and every
other MCP client got 503): against the real API server and `corral mcp --transport http`, with raw HTTP for the
floods and the official MCP client for the callers who must still get in. No controller, no firmware: opening a
session needs only an authenticated token."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import kubernetes
import pytest

from corral.client.enroll import enroll
from corral.devcluster.plane import Plane
from corral.gateway.limits import CALLER_LIMIT
from tests.gateway_harness import HttpGateway, gateway_token, http_client
from tests.harness import api_client, apply_yaml, fresh_namespace, wait_until_allowed

pytestmark = pytest.mark.integration

LIMIT = 4  # sessions per caller here: small, so that 50 callers at their limit stay quick
CALLERS = 50
READER = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader}
rules:
- {apiGroups: [corral.dev], resources: [devices], verbs: [get, list, watch, read]}
"""
BINDING = """
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: reader-{who}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}}
subjects: [{{kind: ServiceAccount, name: {who}, namespace: {ns}}}]
"""
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "flood", "version": "1"}}}
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@dataclass
class Limited:
    plane: Plane
    namespace: str
    gateway: HttpGateway
    tokens: dict[str, str]  # ServiceAccount name -> a token for the gateway


@pytest.fixture(scope="module")
def limited(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Limited]:
    with fresh_namespace(corral_api, "gateway-limits") as namespace:
        enroll(corral_api, namespace, "porch-light", "light")
        names = ["agent", "other", "late", *(f"caller-{n:02d}" for n in range(CALLERS))]
        apply_yaml(corral_api, READER + "".join(f"---{BINDING.format(who=w, ns=namespace)}" for w in ("other", "late")),
                   namespace)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # 53 ServiceAccounts and tokens, a few at a time
            tokens = dict(zip(names, pool.map(lambda who: gateway_token(corral_api, namespace, who), names),
                              strict=True))
        for who in ("other", "late"):
            wait_until_allowed(api_client(plane, token=tokens[who]), "read", namespace, "devices")
        gateway = HttpGateway(plane, namespace, tmp_path_factory.mktemp("gateway-limits") / "gateway.log",
                              "--max-sessions-per-caller", str(LIMIT))
        try:
            yield Limited(plane, namespace, gateway, tokens)
        finally:
            gateway.stop()


async def initialize(http: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
    return await http.post(url, json=INITIALIZE, headers={**HEADERS, "Authorization": f"Bearer {token}"})


async def open_sessions(url: str, tokens: list[str], concurrency: int = 16) -> list[httpx.Response]:
    """One initialize per token in `tokens` (repeats allowed), `concurrency` at a time: the answers, in order."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency)) as http:
        async def one(token: str) -> httpx.Response:
            async with gate:
                return await initialize(http, url, token)

        return list(await asyncio.gather(*(one(t) for t in tokens)))


async def close_sessions(url: str, opened: list[tuple[str, str]]) -> None:
    """DELETE each (token, session id): what a client does when it is done."""
    async with httpx.AsyncClient(timeout=30) as http:
        for token, session in opened:
            await http.delete(url, headers={"Authorization": f"Bearer {token}", "Mcp-Session-Id": session})


async def lists_tools(url: str, token: str) -> list[str]:
    async with http_client(url, token) as client:
        return [t.name for t in (await client.list_tools()).tools]


def refusal_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 429, (response.status_code, response.text[:300])
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == CALLER_LIMIT
    return dict(body["error"])


def test_one_caller_with_1000_session_attempts_does_not_stop_another_callers_initialize(
        limited: Limited, corral_api: kubernetes.client.ApiClient) -> None:
    url, agent = limited.gateway.url, limited.tokens["agent"]
    started = time.monotonic()
    answers = asyncio.run(open_sessions(url, [agent] * 1000))
    flood_s = time.monotonic() - started
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: LIMIT, 429: 1000 - LIMIT}, statuses
    error = refusal_of(next(a for a in answers if a.status_code == 429))
    who = f"system:serviceaccount:{limited.namespace}:agent"
    assert error["message"].startswith(f"{who} already has {LIMIT} open MCP sessions")
    assert f"--max-sessions-per-caller {LIMIT}" in error["message"] and error["data"] == {"limit": "sessions", "max": LIMIT}
    # A freshly minted token names the same user: the limit is the username's, not the token's.
    second = gateway_token(corral_api, limited.namespace, "agent")
    assert second != agent
    refusal_of(asyncio.run(open_sessions(url, [second]))[0])

    # Positive control: another caller initializes and works while the agent sits at its limit.
    assert "iot.list_devices" in asyncio.run(lists_tools(url, limited.tokens["other"]))
    # And the agent itself gets a session again once it ends one of its own.
    opened = [(agent, a.headers["mcp-session-id"]) for a in answers if a.status_code == 200]
    asyncio.run(close_sessions(url, opened[:1]))
    again = asyncio.run(open_sessions(url, [agent]))[0]
    assert again.status_code == 200, again.text[:300]
    asyncio.run(close_sessions(url, [*opened[1:], (agent, again.headers["mcp-session-id"])]))
    print(f"1000 initialize attempts of one caller answered in {flood_s:.1f} s")


def test_fifty_callers_at_their_limits_do_not_block_a_fifty_first(limited: Limited) -> None:
    url = limited.gateway.url
    callers = [limited.tokens[f"caller-{n:02d}"] for n in range(CALLERS)]
    answers = asyncio.run(open_sessions(url, [t for t in callers for _ in range(LIMIT)]))
    assert Counter(a.status_code for a in answers) == {200: CALLERS * LIMIT}
    over = asyncio.run(open_sessions(url, callers))
    assert all(refusal_of(a)["data"] == {"limit": "sessions", "max": LIMIT} for a in over)
    try:
        # 200 sessions open, every caller at its limit: the 51st initializes and lists its tools.
        assert "iot.list_devices" in asyncio.run(lists_tools(url, limited.tokens["late"]))
    finally:
        asyncio.run(close_sessions(url, [(t, a.headers["mcp-session-id"]) for t, a in
                                         zip([t for t in callers for _ in range(LIMIT)], answers, strict=True)]))


def test_an_open_get_stream_alone_does_not_keep_a_session_alive(limited: Limited, tmp_path: Path) -> None:
    idle_s = 1.5
    gateway = HttpGateway(limited.plane, limited.namespace, tmp_path / "idle.log", "--session-idle", str(idle_s))
    token = limited.tokens["other"]

    async def scenario() -> tuple[float, int, int, float]:
        auth = {**HEADERS, "Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(timeout=30) as http:
            sessions = []
            # Before the quiet session's last request, so that its idle time is at least what is measured from here
            # (the busy session starts after it).
            began = time.monotonic()
            for _ in range(2):
                opened = await initialize(http, gateway.url, token)
                session = opened.headers["mcp-session-id"]
                await http.post(gateway.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                headers={**auth, "Mcp-Session-Id": session})
                sessions.append(session)
            quiet, busy = sessions

            async def listen() -> float:  # the quiet session's GET stream, open until the gateway ends it
                get = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": quiet, "Accept": "text/event-stream"}
                async with http.stream("GET", gateway.url, headers=get) as stream:
                    assert stream.status_code == 200
                    async for _ in stream.aiter_bytes():
                        pass
                return time.monotonic() - began

            listening = asyncio.create_task(listen())
            pinged = 0
            while not listening.done() and time.monotonic() - began < 15:
                # The busy session asks something every 0.3 s: a client at work is never cut off.
                answer = await http.post(gateway.url, json={"jsonrpc": "2.0", "id": pinged + 2, "method": "ping"},
                                         headers={**auth, "Mcp-Session-Id": busy})
                assert answer.status_code == 200, answer.text[:200]
                pinged += 1
                await asyncio.sleep(0.3)
            closed_after = await asyncio.wait_for(listening, 5)
            busy_for = time.monotonic() - began
            gone = await http.post(gateway.url, json={"jsonrpc": "2.0", "id": 99, "method": "ping"},
                                   headers={**auth, "Mcp-Session-Id": quiet})
            still = await http.post(gateway.url, json={"jsonrpc": "2.0", "id": 100, "method": "ping"},
                                    headers={**auth, "Mcp-Session-Id": busy})
            return closed_after, gone.status_code, still.status_code, busy_for

    try:
        closed_after, gone, still, busy_for = asyncio.run(scenario())
    finally:
        gateway.stop()
    assert idle_s <= closed_after < idle_s + 8, f"the GET stream ended after {closed_after:.1f} s"
    assert gone == 404, "the quiet session is gone: its client must initialize again"
    assert still == 200 and busy_for > idle_s, "the session in use outlived the idle timeout"
    assert "idle for 1.5 s (an open GET stream does not count): ending it" in (tmp_path / "idle.log").read_text()

