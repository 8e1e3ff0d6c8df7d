"""The gateway's two transports: stdio (the kubeconfig's user) and Streamable HTTP (each request's bearer token).

Over HTTP the SDK's bearer-auth middleware answers a missing or invalid token
with 401 and a WWW-Authenticate header pointing at the protected-resource
metadata (RFC 9728), whose authorization server is the cluster's token issuer.
DNS-rebinding protection (Host and Origin checks) is always on.
"""

from __future__ import annotations

import logging
import signal
from typing import Any
from urllib.parse import urlsplit

import kubernetes
import uvicorn
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from corral.audit.component import Audit
from corral.gateway.identity import Caller, KubeTokenVerifier, anonymous, token_key
from corral.gateway.server import Gateway, RateLimit, instructions
from corral.gateway.view import Views, nothing_visible_note

log = logging.getLogger(__name__)


async def serve_stdio(config: kubernetes.client.Configuration, namespaces: list[str], *, wait_s: float,
                      rate_limit: RateLimit | None = None, audit: Audit | None = None, **view_options: Any) -> None:
    caller = Caller("kubeconfig", config)
    views = Views(namespaces, **view_options)
    # The caller is known before any client connects: an empty view is said at once (Views logs it on stderr;
    # stdout carries the protocol) and in the server's instructions, instead of an empty tool list.
    view = await views.of(caller)
    empty = None if view.visible() else nothing_visible_note(view.username, namespaces)
    gateway = Gateway(views, lambda ctx: caller, wait_s=wait_s, rate_limit=rate_limit,
                      instructions=instructions(namespaces, empty), audit=audit.log if audit else None)
    if audit is not None:
        await audit.start()
    try:
        async with stdio_server() as (read, write):
            await gateway.server.run(read, write, gateway.server.create_initialization_options())
    finally:
        views.stop()
        if audit is not None:
            await audit.stop()


def http_app(config: kubernetes.client.Configuration, namespaces: list[str], *, public_url: str, issuer_url: str,
             allowed_hosts: list[str], wait_s: float, rate_limit: RateLimit | None = None,
             audit: Audit | None = None, **view_options: Any) -> Starlette:
    base = anonymous(config)
    views = Views(namespaces, **view_options)

    def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
        request = ctx.request
        user = getattr(request, "user", None) if isinstance(request, Request) else None
        if not isinstance(user, AuthenticatedUser):
            raise MCPError(-32001, "no bearer token on this request")  # the auth middleware normally answers 401 first
        token = user.access_token.token
        return Caller(token_key(token), base, token)

    gateway = Gateway(views, caller_of, wait_s=wait_s, rate_limit=rate_limit, instructions=instructions(namespaces),
                      audit=audit.log if audit else None)
    public = urlsplit(public_url)
    hosts = sorted({public.netloc, "127.0.0.1:*", "localhost:*", "[::1]:*", *allowed_hosts})
    origins = sorted({f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")})
    return gateway.server.streamable_http_app(
        streamable_http_path=public.path or "/mcp",
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins),
        auth=AuthSettings(issuer_url=AnyHttpUrl(issuer_url), resource_server_url=AnyHttpUrl(public_url),
                          validate_token_resource=False),
        token_verifier=KubeTokenVerifier(config),
        custom_starlette_routes=[Route("/healthz", lambda request: PlainTextResponse("ok"))],
    )


async def serve_http(app: Starlette, host: str, port: int, audit: Audit | None = None) -> None:
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
        if audit is not None:
            await audit.stop()  # the final checkpoint
