"""The Kubernetes calls the page makes, each with the signed-in person's own token.

The console's own configuration gives only the API server's address and CA (`anonymous()`); a person's
token is the one credential of every request made for them. What they may not read, the page does not show;
what they may not create, the API server refuses, and the page says so.
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import aiohttp
import kubernetes

from corral.api.codes import GROUP, VERSION
from corral.api.pause import PAUSE_NAME
from corral.client.intents import Identity
from corral.console.waiting import DeviceKey
from corral.kube.client import ApiError, AsyncApi, path_of

APPROVE_TTL_S: Final = 10.0  # as the controller: a grant or a revocation shows within this time
MAX_TOKEN_CHARS: Final = 16_384
CAPABILITY_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class SignInRefused(Exception):
    """The token cannot sign anyone in; the message says why, for the person."""


def with_token(base: kubernetes.client.Configuration, token: str) -> kubernetes.client.Configuration:
    """The base configuration (cluster address and CA, no credentials) with this bearer token as its only one."""
    config = copy.copy(base)
    config.api_key = {"authorization": f"Bearer {token}"}
    config.api_key_prefix = {}
    config.refresh_api_key_hook = None
    return config


def clean_token(pasted: str) -> str:
    """The token as pasted (whitespace and a leading `Bearer ` removed); SignInRefused if it cannot be one."""
    token = pasted.strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    if not token:
        raise SignInRefused("Paste a token: e.g. the one `corral people add NAME` printed, or "
                            "`kubectl create token NAME -n corral-people`.")
    if len(token) > MAX_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in token):
        raise SignInRefused("That is not a bearer token: a token is one line of printable characters without spaces.")
    return token


class Person:
    """One signed-in person: a client acting with their token, and their recent `approve` answers."""

    def __init__(self, base: kubernetes.client.Configuration, token: str, identity: Identity,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.identity = identity
        self.api = AsyncApi(with_token(base, token), connections=8, timeout_s=15.0)
        self._clock = clock
        self._approve: dict[DeviceKey, tuple[float, bool]] = {}
        self._contracts: dict[str, dict[str, Any]] = {}  # Capability name -> its spec
        self._no_contract: dict[str, float] = {}  # Capability name -> until when a refusal stands

    async def close(self) -> None:
        await self.api.close()

    async def may_approve(self, key: DeviceKey) -> bool:
        """Whether the person holds `approve` on this Device (SelfSubjectAccessReview, remembered 10 s)."""
        hit = self._approve.get(key)
        now = self._clock()
        if hit is not None and hit[0] > now:
            return hit[1]
        namespace, device = key
        review = await self.api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": namespace, "verb": "approve", "group": GROUP,
                                            "resource": "devices", "name": device}},
        })
        allowed = bool((review.get("status") or {}).get("allowed"))
        if len(self._approve) > 4096:
            self._approve.clear()
        self._approve[key] = (now + APPROVE_TTL_S, allowed)
        return allowed

    async def approvable(self, keys: Iterable[DeviceKey]) -> set[DeviceKey]:
        keys = list(keys)
        answers = await asyncio.gather(*(self.may_approve(k) for k in keys))
        return {k for k, ok in zip(keys, answers, strict=True) if ok}

    async def device(self, key: DeviceKey) -> dict[str, Any] | None:
        """The Device, or None when it is gone or the person may not read it."""
        try:
            return await self.api.request("GET", path_of(GROUP, VERSION, "devices", key[0], key[1]))
        except ApiError as err:
            if err.status in (403, 404):
                return None
            raise

    async def devices(self, keys: Iterable[DeviceKey]) -> dict[DeviceKey, dict[str, Any] | None]:
        keys = list(keys)
        found = await asyncio.gather(*(self.device(k) for k in keys))
        return dict(zip(keys, found, strict=True))

    async def contract(self, device: dict[str, Any] | None) -> dict[str, Any] | None:
        """The spec of the Capability the controller trusts for this Device (its accepted one, else the one it
        announced), or None when there is none or the person may not read it. Capabilities never change (their
        name is their content's hash), so a read one is kept; a refusal is asked again after APPROVE_TTL_S."""
        status = (device or {}).get("status") or {}
        name = status.get("acceptedCapability") or status.get("capability")
        if not isinstance(name, str) or not CAPABILITY_NAME.fullmatch(name):
            return None
        now = self._clock()
        if name in self._contracts:
            return self._contracts[name]
        if self._no_contract.get(name, 0.0) > now:
            return None
        try:
            found = await self.api.request("GET", path_of(GROUP, VERSION, "capabilities", None, name))
        except ApiError as err:
            if err.status not in (403, 404):
                raise
            if len(self._no_contract) > 256:
                self._no_contract.clear()
            self._no_contract[name] = now + APPROVE_TTL_S
            return None
        if len(self._contracts) > 256:
            self._contracts.clear()
        self._contracts[name] = spec = dict(found.get("spec") or {})
        return spec

    async def contracts(self, devices: dict[DeviceKey, dict[str, Any] | None]
                        ) -> dict[DeviceKey, dict[str, Any] | None]:
        keys = list(devices)
        found = await asyncio.gather(*(self.contract(devices[k]) for k in keys))
        return dict(zip(keys, found, strict=True))

    async def switches(self, namespaces: list[str] | None) -> list[dict[str, Any]]:
        """The AgentPauses (agents kill switch) of these namespaces (None: every namespace) that the person may
        read; none where they may not."""
        async def one(path: str) -> list[dict[str, Any]]:
            try:
                found = await self.api.request("GET", path)
            except ApiError as err:
                if err.status in (403, 404):
                    return []
                raise
            return list(found.get("items") or []) if "items" in found else [found]

        if namespaces is None:
            return await one(path_of(GROUP, VERSION, "agentpauses"))
        results = await asyncio.gather(*(one(path_of(GROUP, VERSION, "agentpauses", ns, PAUSE_NAME))
                                         for ns in namespaces))
        return [body for bodies in results for body in bodies]

    async def intent(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.api.request("GET", path_of(GROUP, VERSION, "intents", namespace, name))

    async def intents(self, namespaces: list[str] | None) -> tuple[list[dict[str, Any]], list[str]]:
        """The Intents in these namespaces (None: every namespace the person may list them in), and sentences
        about the namespaces that could not be read."""
        if namespaces is None:
            try:
                return list((await self.api.request("GET", path_of(GROUP, VERSION, "intents")))["items"]), []
            except ApiError as err:
                if err.status != 403:
                    raise
            try:
                listed = await self.api.request("GET", path_of("", "v1", "namespaces"))
            except ApiError as err:
                if err.status != 403:
                    raise
                return [], ["You may neither list Intents in every namespace nor list the namespaces: the console "
                            "must be started with -n NAMESPACE for the namespaces you approve in."]
            found = await self._in_namespaces([n["metadata"]["name"] for n in listed.get("items") or []], quiet=True)
            return found[0], []
        return await self._in_namespaces(namespaces, quiet=False)

    async def _in_namespaces(self, namespaces: list[str], quiet: bool) -> tuple[list[dict[str, Any]], list[str]]:
        async def one(namespace: str) -> tuple[list[dict[str, Any]], str | None]:
            try:
                listed = await self.api.request("GET", path_of(GROUP, VERSION, "intents", namespace))
            except ApiError as err:
                if err.status not in (403, 404):
                    raise
                return [], None if quiet else f"You may not list Intents in namespace {namespace} ({err.status})."
            items = list(listed.get("items") or [])
            for item in items:  # a namespaced list names the namespace in each item's metadata already
                item.setdefault("metadata", {}).setdefault("namespace", namespace)
            return items, None

        results = await asyncio.gather(*(one(n) for n in namespaces))
        return [i for items, _ in results for i in items], [p for _, p in results if p]


async def review(base: kubernetes.client.Configuration, token: str) -> Identity:
    """Who the token belongs to, from a SelfSubjectReview made with it; SignInRefused when the API server
    does not accept it."""
    api = AsyncApi(with_token(base, token), connections=1, timeout_s=15.0)
    try:
        answer = await api.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                   body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    except ApiError as err:
        if err.status == 401:
            raise SignInRefused("The API server did not accept this token: it may have expired, been revoked, or "
                                "come from another cluster. Ask for a new one (`corral people add NAME`).") from None
        raise SignInRefused(f"The API server answered {err.status} to the token's review: {err.message}") from None
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        raise SignInRefused(f"The console cannot reach the API server to check the token: {err}") from None
    finally:
        await api.close()
    user = (answer.get("status") or {}).get("userInfo") or {}
    username = user.get("username")
    if not isinstance(username, str) or not username:
        raise SignInRefused("The API server's review of this token named no user.")
    return Identity(username, tuple(str(g) for g in user.get("groups") or []))
