"""The gateway's two transports: stdio (the kubeconfig's user) and Streamable HTTP (each request's bearer token).

Over HTTP a missing or refused token gets 401 with a WWW-Authenticate header
pointing at the protected-resource metadata (RFC 9728), whose authorization
server is the cluster's token issuer: the SDK's bearer-auth middleware, whose
challenge on the MCP endpoint is ours so that it says what was wrong with the
token (not a JWT, another audience, expired, refused by the API server) and how
to mint a right one. DNS-rebinding protection (Host and Origin checks) is always
on.
"""

from __future__ import annotations

import json
import logging
import signal
from typing import Any
from urllib.parse import urlsplit

import kubernetes
import uvicorn
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, RequireAuthMiddleware
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import DEFAULT_MAX_SESSIONS
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from corral.api.codes import GATEWAY_AUDIENCE
from corral.audit.component import Audit
from corral.gateway import readings
from corral.gateway.identity import Caller, KubeTokenVerifier, anonymous, token_key
from corral.gateway.limits import Bounded, Bounds, raise_fd_limit
from corral.gateway.pauses import paused_text
from corral.gateway.server import Gateway, RateLimit, instructions, session_holder
from corral.gateway.unseen import nothing_visible_note
from corral.gateway.view import Views

log = logging.getLogger(__name__)


async def serve_stdio(config: kubernetes.client.Configuration, namespaces: list[str], *, wait_s: float,
                      rate_limit: RateLimit | None = None, audit: Audit | None = None,
                      readings_direct: readings.Direct | None = None, console_url: str | None = None,
                      **view_options: Any) -> None:
    caller = Caller("kubeconfig", config)
    views = Views(namespaces, **view_options)
    # The caller is known before any client connects: an empty view is said at once (Views logs it on stderr;
    # stdout carries the protocol) and in the server's instructions, instead of an empty tool list.
    view = await views.of(caller)
    empty = None if view.visible() else nothing_visible_note(view.username, namespaces)
    pauses = await view.pauses()  # and agents paused, as they are when the client connects (tools say it later)
    paused = paused_text([pauses[ns] for ns in sorted(pauses)], view.is_person()) if pauses else None
    gateway = Gateway(views, lambda ctx: caller, wait_s=wait_s, rate_limit=rate_limit,
                      instructions=instructions(namespaces, empty, paused), audit=audit.log if audit else None,
                      readings_direct=readings_direct, console_url=console_url)
    if audit is not None:
        await audit.start()
    try:
        async with stdio_server() as (read, write):
            await gateway.server.run(read, write, gateway.server.create_initialization_options())
    finally:
        await gateway.release_held()  # the stdio session ended: its leases end with it
        views.stop()
        await gateway.readings.close()
        if audit is not None:
            await audit.stop()


def _bearer(scope: Scope) -> str | None:
    header = Headers(scope=scope).get("authorization")
    return header[7:] if header and header.lower().startswith("bearer ") else None  # as the SDK's BearerAuthBackend


def _quotable(text: str) -> str:
    """Text fit for a quoted-string of WWW-Authenticate (RFC 6750 §3: printable ASCII but \" and \\)."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "'" if c == '"' else "?" for c in text)


class RequireToken:
    """In place of the SDK's RequireAuthMiddleware on the MCP endpoint (it stays inside, for everything else):
    a request without an authenticated user gets the same 401 challenge, `Bearer resource_metadata="…",
    error="invalid_token", error_description="…"`, with a description and JSON body that say what was wrong with
    the token and name the kubectl command that mints a right one."""

    def __init__(self, inner: RequireAuthMiddleware, verifier: KubeTokenVerifier, bounded: Bounded | None = None
                 ) -> None:
        self.inner = inner
        self.verifier = verifier
        self.bounded = bounded  # per-caller bounds, once the caller is known

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if isinstance(scope.get("user"), AuthenticatedUser):
            await (self.bounded or self.inner)(scope, receive, send)
            return
        description = _quotable(self.verifier.refusal(_bearer(scope)))
        metadata = self.inner.resource_metadata_url
        challenge = [f'resource_metadata="{metadata}"'] if metadata else []
        challenge += ['error="invalid_token"', f'error_description="{description}"']
        body = json.dumps({"error": "invalid_token", "error_description": description}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", ("Bearer " + ", ".join(challenge)).encode())]})
        await send({"type": "http.response.body", "body": body})


def http_app(config: kubernetes.client.Configuration, namespaces: list[str], *, public_url: str, issuer_url: str,
             allowed_hosts: list[str], wait_s: float, rate_limit: RateLimit | None = None,
             audit: Audit | None = None, audience: str = GATEWAY_AUDIENCE,
             readings_direct: readings.Direct | None = None, console_url: str | None = None,
             bounds: Bounds | None = None, **view_options: Any) -> Starlette:
    bounds = bounds or Bounds()
    if bounds.sessions_per_caller * 2 > DEFAULT_MAX_SESSIONS:
        raise ValueError(f"at most {DEFAULT_MAX_SESSIONS // 2} sessions per caller: the SDK's limit for the whole "
                         f"gateway ({DEFAULT_MAX_SESSIONS}) must stay out of one caller's reach")
    base = anonymous(config)
    views = Views(namespaces, **view_options)

    def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
        request = ctx.request
        user = getattr(request, "user", None) if isinstance(request, Request) else None
        if not isinstance(user, AuthenticatedUser):
            raise MCPError(-32001, "no bearer token on this request")  # the auth middleware normally answers 401 first
        token = user.access_token.token
        return Caller(token_key(token), base, token, username=user.access_token.client_id)

    gateway = Gateway(views, caller_of, wait_s=wait_s, rate_limit=rate_limit, instructions=instructions(namespaces, caller_known=False),
                      audit=audit.log if audit else None, readings_direct=readings_direct, console_url=console_url)
    public = urlsplit(public_url)
    hosts = sorted({public.netloc, "127.0.0.1:*", "localhost:*", "[::1]:*", *allowed_hosts})
    origins = sorted({f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")})
    verifier = KubeTokenVerifier(config, audience)
    path = public.path or "/mcp"
    app = gateway.server.streamable_http_app(
        streamable_http_path=path,
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins),
        # The resource (RFC 9728) is the public URL, as a client must find it; the audience a token must carry is
        # the verifier's (a Kubernetes TokenRequest audience), so the SDK's resource check stays off.
        auth=AuthSettings(issuer_url=AnyHttpUrl(issuer_url), resource_server_url=AnyHttpUrl(public_url),
                          validate_token_resource=False),
        token_verifier=verifier,
        session_idle_timeout=bounds.idle_s,
        custom_starlette_routes=[Route("/healthz", lambda request: PlainTextResponse("ok"))],
    )
    guarded = [i for i, route in enumerate(app.router.routes) if isinstance(route, Route) and route.path == path
               and isinstance(route.endpoint, RequireAuthMiddleware)]
    if len(guarded) != 1:
        raise RuntimeError(f"the MCP SDK's app has {len(guarded)} token-guarded routes at {path}, not one")
    inner = app.router.routes[guarded[0]]
    assert isinstance(inner, Route) and isinstance(inner.endpoint, RequireAuthMiddleware)
    bounded = Bounded(inner.endpoint, bounds, lambda session_id: _end_session(gateway, session_id))
    app.router.routes[guarded[0]] = Route(path, endpoint=RequireToken(inner.endpoint, verifier, bounded),
                                          methods=inner.methods)
    app.state.gateway = gateway  # serve_http closes what it holds open
    _when_sessions_end(gateway, bounded)
    _json_answers_in_sessions(gateway)
    return app


def _json_answers_in_sessions(gateway: Gateway) -> None:
    """A handshake-era session's requests are answered with one JSON body instead of an SSE stream.

    The SDK's client closes an SSE response once it has the result, before the stream's end, so each call cost a
    new TCP connection at both ends: about 2.4 ms of the gateway's CPU and 1.5 ms of the client's per call
    (bench/mcp_transport.py). Nothing is lost: no handler sends progress, log messages or requests to the client
    while it answers, and what the gateway does send unasked (list_changed, resources/updated) takes the session's
    GET stream, which stays SSE. 2026-07-28 requests keep the SDK's own choice (JSON unless the handler streams),
    so subscriptions/listen and a call that emits notifications still get SSE there. The manager has no option for
    the handshake era alone, so its one place where a session's transport is made is wrapped (`mcp` is pinned)."""
    manager = getattr(gateway.server, "_session_manager", None)
    admit = getattr(manager, "_admit_session", None)
    if manager is None or admit is None:
        raise RuntimeError("the MCP SDK's session manager changed: sessions could not answer with JSON")

    def admitted(requestor: Any) -> Any:
        transport = admit(requestor)
        if transport is not None:
            transport.is_json_response_enabled = True
        return transport

    manager._admit_session = admitted


async def _end_session(gateway: Gateway, session_id: str) -> None:
    """End a session as the SDK's own idle timeout does (its server task leaves and discards it), even while a
    GET stream holds it open."""
    manager = getattr(gateway.server, "_session_manager", None)
    transport = getattr(manager, "_server_instances", {}).get(session_id)
    if transport is None:
        return
    if transport.idle_scope is not None:
        transport.idle_scope.cancel()
    else:
        await transport.terminate()


def _when_sessions_end(gateway: Gateway, bounded: Bounded) -> None:
    """A handshake-era HTTP session that ends (the client's DELETE, its idle timeout) gives its leases back and
    no longer counts against its caller's limit.

    The SDK's session manager has no hook for a session's end, so its one place where every session ends is
    wrapped; `mcp` is pinned exactly, and tests/integration/test_leases.py and test_gateway_limits.py fail if
    this stops working."""
    manager = getattr(gateway.server, "_session_manager", None)
    discard = getattr(manager, "_discard_session", None)
    if manager is None or discard is None or not isinstance(getattr(manager, "_server_instances", None), dict):
        raise RuntimeError("the MCP SDK's session manager changed: leases could not end with their HTTP session")

    async def discarded(session_id: str, transport: Any) -> None:
        bounded.ended(session_id)
        await discard(session_id, transport)
        await gateway.release_held(session_holder(session_id))

    manager._discard_session = discarded


async def serve_http(app: Starlette, host: str, port: int, audit: Audit | None = None) -> None:
    before, after = raise_fd_limit()
    log.info("open-files limit %d (was %d): every session's stream and waiting call holds one", after, before)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    if audit is not None:
        # uvicorn raises the signal that stopped it again once it has shut down; with the default handler the
        # process would die right there, before the final checkpoint. These handlers let it return instead.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda number, frame: None)
        await audit.start()
    try:
        await server.serve()
    finally:
        gateway = getattr(app.state, "gateway", None)
        if isinstance(gateway, Gateway):
            await gateway.readings.close()
        if audit is not None:
            await audit.stop()  # the final checkpoint
