"""Following one Intent to its outcome, asynchronously, with the caller's own credentials.

A caller may wait minutes for a human's approval. Waiting must hold no thread: the official Kubernetes
client is synchronous, and every thread a waiting caller held would be one fewer for everybody else's
tool calls. So the gateway follows an Intent with an asynchronous HTTP watch (httpx2, the MCP SDK's own
HTTP client) built from the caller's client configuration: the same API server, CA, bearer token or
client certificate, and impersonation headers. A caller without `watch` on Intents is polled instead,
still without a thread.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx2
import kubernetes

from corral.api.codes import GROUP, VERSION

Body = dict[str, Any]
POLL_S = 0.05


class Forbidden(Exception):
    """The caller may not do this (403)."""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def _ssl_context(config: kubernetes.client.Configuration) -> ssl.SSLContext | bool:
    if not config.verify_ssl:
        return False
    context = ssl.create_default_context(cafile=config.ssl_ca_cert) if config.ssl_ca_cert else ssl.create_default_context()
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


class IntentFollower:
    """One caller's asynchronous reads of Intents."""

    def __init__(self, config: kubernetes.client.Configuration, headers: dict[str, str] | None = None) -> None:
        self._config = config
        self._client = httpx2.AsyncClient(base_url=config.host, verify=_ssl_context(config), headers=headers or {},
                                          timeout=httpx2.Timeout(30.0, connect=10.0), trust_env=False)

    async def close(self) -> None:
        await self._client.aclose()

    def _auth(self) -> dict[str, str]:
        # As the official client authenticates: the configuration's header credentials (its refresh hook, for
        # exec credential plugins, runs here); client certificates are in the TLS context.
        return {setting["key"]: str(setting["value"]) for setting in self._config.auth_settings().values()
                if setting.get("in") == "header" and setting.get("value")}

    async def get(self, namespace: str, name: str) -> Body:
        response = await self._client.get(f"{_path(namespace)}/{quote(name)}", headers=self._auth())
        _raise_for(response)
        return dict(response.json())

    async def until(self, namespace: str, name: str, done: Callable[[Body], bool], timeout_s: float) -> Body:
        """The Intent once `done(intent)`, or as last seen when timeout_s runs out."""
        deadline = time.monotonic() + timeout_s
        try:
            return await self._watch(namespace, name, done, deadline)
        except Forbidden:
            pass
        while True:
            intent = await self.get(namespace, name)
            if done(intent) or time.monotonic() >= deadline:
                return intent
            await asyncio.sleep(POLL_S)

    async def _watch(self, namespace: str, name: str, done: Callable[[Body], bool], deadline: float) -> Body:
        last: Body | None = None
        version: str | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return last if last is not None else await self.get(namespace, name)
            params = {"watch": "1", "fieldSelector": f"metadata.name={name}", "allowWatchBookmarks": "true",
                      "timeoutSeconds": str(max(1, int(remaining + 0.999)))}
            if version is not None:
                params["resourceVersion"] = version
            # Without a resourceVersion the watch starts with the Intent as it is now: nothing is missed.
            try:
                async with asyncio.timeout(remaining + 5):
                    async with self._client.stream("GET", _path(namespace), params=params, headers=self._auth(),
                                                   timeout=httpx2.Timeout(remaining + 5, connect=10.0)) as response:
                        if response.status_code == 403:
                            raise Forbidden(name)
                        if response.status_code == 410:
                            version = None  # too old: start again from now
                            continue
                        if response.status_code >= 400:
                            await response.aread()
                            _raise_for(response)
                        async for line in response.aiter_lines():
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            obj = event.get("object") or {}
                            version = (obj.get("metadata") or {}).get("resourceVersion", version)
                            if event.get("type") in ("ADDED", "MODIFIED"):
                                last = obj
                                if done(obj):
                                    return obj
                            elif event.get("type") == "ERROR":
                                version = None
                                break
            except TimeoutError:
                return last if last is not None else await self.get(namespace, name)


def _path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/intents"


def _raise_for(response: httpx2.Response) -> None:
    if response.status_code < 400:
        return
    if response.status_code == 403:
        raise Forbidden(response.text[:200])
    try:
        message = str(response.json().get("message") or response.reason_phrase)
    except ValueError:
        message = response.reason_phrase
    raise ApiError(response.status_code, message)
