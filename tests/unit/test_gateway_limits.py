"""The gateway's per-caller bounds (gateway/limits.py) without a network: sessions and streams counted per
username, the 429 that names the limit, and idleness that an open GET stream does not hide."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kubernetes
import pytest
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from corral.gateway.limits import CALLER_LIMIT, Bounded, Bounds, Ledger, opens_a_session

AGENT, OTHER = "system:serviceaccount:home:agent", "system:serviceaccount:home:other"


def test_a_caller_at_its_session_limit_is_refused_naming_the_limit_and_others_are_untouched() -> None:
    ledger = Ledger(Bounds(sessions_per_caller=2))
    for n in range(2):
        assert ledger.reserve_session(AGENT) is None
        ledger.opened(AGENT, f"s{n}", 0.0)
    refused = ledger.reserve_session(AGENT)
    assert refused is not None and "2 open MCP sessions" in refused and "--max-sessions-per-caller 2" in refused
    assert ledger.reserve_session(OTHER) is None, "another caller still opens a session"
    ledger.ended("s0")
    assert ledger.reserve_session(AGENT) is None, "an ended session makes room again"


def test_a_refused_or_failed_opening_does_not_keep_its_place() -> None:
    ledger = Ledger(Bounds(sessions_per_caller=1))
    assert ledger.reserve_session(AGENT) is None
    ledger.unreserve(AGENT)  # e.g. not an initialize: the SDK answered 400 and opened nothing
    assert ledger.sessions_of(AGENT) == 0 and ledger.reserve_session(AGENT) is None


def test_streams_are_bounded_per_caller() -> None:
    ledger = Ledger(Bounds(streams_per_caller=3))
    assert [ledger.begin_stream(AGENT) for _ in range(3)] == [None, None, None]
    refused = ledger.begin_stream(AGENT)
    assert refused is not None and "--max-streams-per-caller 3" in refused
    assert ledger.begin_stream(OTHER) is None
    ledger.end_stream(AGENT)
    assert ledger.begin_stream(AGENT) is None


def test_a_session_with_only_a_get_stream_goes_idle_one_with_a_request_in_flight_does_not() -> None:
    ledger = Ledger(Bounds(idle_s=300))
    for sid in ("listening", "busy", "chatty"):
        assert ledger.reserve_session(AGENT) is None
        ledger.opened(AGENT, sid, 0.0)
    assert ledger.request_begins("busy", AGENT, 10.0)  # e.g. iot.intent_status waiting for a person
    assert ledger.request_begins("chatty", AGENT, 250.0)
    ledger.request_ends("chatty", 250.0)
    assert not ledger.request_begins("listening", OTHER, 250.0), "someone else's request does not keep it alive"
    assert ledger.idle(299.0) == []
    assert ledger.idle(300.0) == ["listening"]
    assert sorted(ledger.idle(560.0)) == ["chatty", "listening"]
    ledger.request_ends("busy", 560.0)
    assert "busy" not in ledger.idle(800.0) and "busy" in ledger.idle(860.0)


def scope(method: str, headers: dict[str, str], caller: str | None = AGENT) -> dict[str, Any]:
    scope: dict[str, Any] = {"type": "http", "method": method, "path": "/mcp",
                             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    if caller is not None:
        scope["user"] = AuthenticatedUser(AccessToken(token="t", client_id=caller, scopes=[], subject=caller))
    return scope


def test_only_a_handshake_era_post_without_a_session_opens_one() -> None:
    assert opens_a_session(scope("POST", {}))
    assert opens_a_session(scope("POST", {"mcp-protocol-version": "2025-11-25"}))
    assert not opens_a_session(scope("POST", {"mcp-session-id": "abc"}))
    assert not opens_a_session(scope("GET", {}))
    assert not opens_a_session(scope("POST", {"mcp-protocol-version": "2026-07-28"}))  # no sessions there


def test_the_asgi_bound_answers_429_with_a_json_rpc_error_and_lets_other_callers_in() -> None:
    opened = 0

    async def sdk(scope: Any, receive: Any, send: Any) -> None:  # stands in for the SDK: opens a session each time
        nonlocal opened
        opened += 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"mcp-session-id", f"s{opened}".encode())]})
        await send({"type": "http.response.body", "body": b"{}"})

    async def call(bounded: Bounded, caller: str) -> tuple[int, dict[str, str], bytes]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await bounded(scope("POST", {}, caller), None, send)
        headers = {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}
        return sent[0]["status"], headers, sent[1]["body"]

    async def scenario() -> list[tuple[int, dict[str, str], bytes]]:
        bounded = Bounded(sdk, Bounds(sessions_per_caller=2, idle_s=120), lambda sid: asyncio.sleep(0))
        answers = [await call(bounded, AGENT) for _ in range(3)] + [await call(bounded, OTHER)]
        assert bounded._reaper is not None
        bounded._reaper.cancel()
        return answers

    answers = asyncio.run(scenario())
    assert [status for status, _, _ in answers] == [200, 200, 429, 200]
    _, headers, body = answers[2]
    error = json.loads(body)
    assert error["jsonrpc"] == "2.0" and error["id"] is None and error["error"]["code"] == CALLER_LIMIT
    assert error["error"]["message"].startswith(f"{AGENT} already has 2 open MCP sessions")
    assert error["error"]["data"] == {"limit": "sessions", "max": 2}
    assert headers["retry-after"] == "120"
    assert opened == 3, "the refused request never reached the SDK"


@pytest.mark.parametrize("bad", [{"sessions_per_caller": 0}, {"streams_per_caller": 0}, {"idle_s": 0}])
def test_bounds_must_allow_something(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Bounds(**bad)


@pytest.mark.parametrize("option", ["--max-sessions-per-caller", "--max-streams-per-caller"])
def test_the_command_line_refuses_a_limit_below_one(option: str) -> None:
    from click.testing import CliRunner

    from corral.cli.mcp import mcp

    done = CliRunner().invoke(mcp, ["--transport", "http", option, "0"])
    assert done.exit_code == 2 and f"Invalid value for '{option}': 0 is not in the range" in done.output


def test_one_username_keeps_a_bounded_number_of_views_however_many_tokens_it_mints() -> None:
    from corral.gateway.view import crowded

    views = [(f"agent-{n}", AGENT, float(n), 0) for n in range(10)] + [("other", OTHER, 0.0, 0)]
    views[3] = ("agent-3", AGENT, 3.0, 1)  # a view with a listener (an open stream) is never stopped
    assert crowded(views, AGENT, keep=6) == ["agent-0", "agent-1", "agent-2", "agent-4"]
    assert crowded(views, OTHER, keep=7) == [], "another caller's views are not touched"
    assert crowded(views[:5], AGENT, keep=7) == []


def test_one_caller_may_not_be_allowed_the_sdks_whole_session_limit() -> None:
    from corral.gateway.serve import http_app

    with pytest.raises(ValueError, match="must stay out of one caller's reach"):
        http_app(kubernetes.client.Configuration(), ["home"], public_url="http://127.0.0.1:8000/mcp",
                 issuer_url="https://127.0.0.1:6443", allowed_hosts=[], wait_s=1.0,
                 bounds=Bounds(sessions_per_caller=6000))
