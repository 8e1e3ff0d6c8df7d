"""Who is asking, and may they: TokenReview for the bearer token, SubjectAccessReview for the verb.

The server holds no list of its own users: a caller is whoever the API server says its token belongs to,
and may do what RBAC grants that identity (with its groups). Answers are remembered for a few seconds
(the token by its hash only), so a burst of requests costs one review each, and a revoked token or a
removed grant shows within that time.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from corral.client.asyncapi import AsyncApi, path_of

K = TypeVar("K")
V = TypeVar("V")

TTL_S = 10.0
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Caller:
    username: str
    groups: tuple[str, ...]
    uid: str = ""


class Unauthenticated(Exception):
    pass


class Reviews:
    def __init__(self, api: AsyncApi, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.ttl_s = ttl_s
        self._clock = clock
        self._tokens: dict[str, tuple[float, Caller | None]] = {}
        self._answers: dict[tuple[object, ...], tuple[float, bool]] = {}

    async def caller(self, token: str) -> Caller:
        """The identity the token belongs to; Unauthenticated when the API server does not know it."""
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._tokens.get(key)
        if hit is None or hit[0] <= self._clock():
            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
            answer = await self.api.request("POST", path_of("authentication.k8s.io", "v1", "tokenreviews"),
                                            body=review)
            status = answer.get("status") or {}
            user = status.get("user") or {}
            caller = Caller(user["username"], tuple(user.get("groups") or ()), user.get("uid") or "") \
                if status.get("authenticated") and user.get("username") else None
            self._remember(self._tokens, key, caller)
            hit = self._tokens[key]
        if hit[1] is None:
            raise Unauthenticated("the API server does not accept this token")
        return hit[1]

    async def may(self, caller: Caller, verb: str, resource: str, namespace: str | None,
                  name: str | None = None) -> bool:
        """SubjectAccessReview of `verb` on corral.dev `resource` (in `namespace`, or cluster-wide)."""
        question = (caller, verb, resource, namespace, name)
        hit = self._answers.get(question)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        attributes = {"group": "corral.dev", "resource": resource, "verb": verb}
        if namespace:
            attributes["namespace"] = namespace
        if name:
            attributes["name"] = name
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": caller.username, "groups": list(caller.groups), "uid": caller.uid,
                           "resourceAttributes": attributes}}
        answer = await self.api.request("POST", path_of("authorization.k8s.io", "v1", "subjectaccessreviews"),
                                        body=review)
        allowed = bool((answer.get("status") or {}).get("allowed"))
        self._remember(self._answers, question, allowed)
        return allowed

    def _remember(self, table: dict[K, tuple[float, V]], key: K, value: V) -> None:
        if len(table) >= MAX_ENTRIES:
            table.clear()
        table[key] = (self._clock() + self.ttl_s, value)
