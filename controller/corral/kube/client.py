"""An asynchronous client for the few Kubernetes REST calls Corral makes on its hot paths.

The official client is synchronous: each call costs a thread hop each way, and under load the threads
fight the event loop for the GIL. The controller's calls and the gateway's Intent calls go through this
instead: aiohttp (which kopf runs on too; its HTTP parser is compiled, about a quarter of the CPU per
request of a pure-Python client here) with a pool of kept connections, on the event loop. Credentials
and TLS come from an official client `Configuration` (a kubeconfig, the in-cluster ServiceAccount, or a
caller's bearer token), applied as the official client would: its header credentials (with its refresh
hook, for rotating ServiceAccount tokens and exec plugins) and its client certificate.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import kubernetes

from corral.kube.typed import Body

JSON = "application/json"
APPLY = "application/apply-patch+yaml"  # server-side apply; JSON is valid YAML
MERGE = "application/merge-patch+json"
RETRIES = 8
_UNAVAILABLE = (429, 503)  # refused before it was processed: safe to send again, even a create


class ApiError(Exception):
    """The API server refused: its HTTP status and its own message (what was wrong, often how to fix it)."""

    def __init__(self, status: int, message: str, body: Body | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.body = body or {}

    @property
    def reason(self) -> str:
        return str(self.body.get("reason") or "")

    def causes(self) -> list[Body]:
        return list((self.body.get("details") or {}).get("causes") or [])


def ssl_context(config: kubernetes.client.Configuration) -> ssl.SSLContext | bool:
    if not config.verify_ssl:
        return False
    context = ssl.create_default_context(cafile=config.ssl_ca_cert) if config.ssl_ca_cert else ssl.create_default_context()
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


class AsyncApi:
    def __init__(self, config: kubernetes.client.Configuration, headers: Mapping[str, str] | None = None,
                 connections: int = 32, timeout_s: float = 30.0) -> None:
        self._config = config
        self._headers = dict(headers or {})
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10.0)
        self._session: aiohttp.ClientSession | None = None  # made on the event loop, at first use

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Connections are kept: a new one costs a TLS handshake, on both sides.
            connector = aiohttp.TCPConnector(ssl=ssl_context(self._config), limit=self._connections,
                                             keepalive_timeout=120.0)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers, timeout=self._timeout,
                                                  trust_env=False)
        return self._session

    def sibling(self, connections: int) -> AsyncApi:
        """The same server and credentials on a pool of its own: for calls that must not queue behind this pool's
        traffic (Lease renewals, whose deadline is seconds, behind a burst of status writes)."""
        return AsyncApi(self._config, self._headers, connections=connections,
                        timeout_s=float(self._timeout.total or 30.0))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _url(self, path: str) -> str:
        return str(self._config.host).rstrip("/") + path  # a server URL may carry a path prefix (a proxy's)

    def _auth(self) -> dict[str, str]:
        return {setting["key"]: str(setting["value"]) for setting in self._config.auth_settings().values()
                if setting.get("in") == "header" and setting.get("value")}

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = JSON, impersonate: Sequence[tuple[str, str]] = ()
                      ) -> Body:
        """`impersonate`: Impersonate-User and Impersonate-Group headers (a group header repeats, one per group), for
        a call made in another identity's name (a Rule's Intents, in its ServiceAccount's)."""
        session = self._open()
        headers = self._auth()
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":"))
            headers["Content-Type"] = content_type
        sent: dict[str, str] | list[tuple[str, str]] = [*headers.items(), *impersonate] if impersonate else headers
        for attempt in range(1, RETRIES + 1):
            async with session.request(method, self._url(path), params=params, data=data,
                                       headers=sent) as response:
                content = await response.read()
                status, retry_after, reason = response.status, response.headers.get("Retry-After"), response.reason
            if status not in _UNAVAILABLE or attempt == RETRIES:
                break
            # As client-go does: the server did not take the request (it is starting, or shedding load); wait
            # as long as it asks, within reason, and send it again.
            await asyncio.sleep(_retry_after(retry_after, attempt))
        if status >= 400:
            raise _error(status, content, reason or "")
        return dict(json.loads(content)) if content else {}

    async def watch(self, path: str, params: Mapping[str, str], timeout_s: float) -> AsyncIterator[Body]:
        """Watch events (`{"type", "object"}`) until the server ends the watch; ApiError when it refuses."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=timeout_s + 5, connect=10.0)
        async with self._open().get(self._url(path), params=query, headers=self._auth(), timeout=timeout) as response:
            if response.status >= 400:
                raise _error(response.status, await response.read(), response.reason or "")
            pending = b""
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)


def _retry_after(header: str | None, attempt: int) -> float:
    try:
        asked = float(header) if header else 0.0
    except ValueError:
        asked = 0.0
    return min(5.0, max(asked, 0.1 * 2.0 ** attempt))


def _error(status: int, content: bytes, reason: str) -> ApiError:
    try:
        body = json.loads(content)
    except ValueError:
        return ApiError(status, reason)
    if not isinstance(body, dict):
        return ApiError(status, reason)
    return ApiError(status, str(body.get("message") or reason), body)


def path_of(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None,
            subresource: str | None = None) -> str:
    """The REST path of a resource collection, object or subresource (`group` "" for the core API)."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace is not None:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{name}"
    if subresource is not None:
        base += f"/{subresource}"
    return base
