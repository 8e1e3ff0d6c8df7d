"""Who is asking, and may they: TokenReview for the bearer token, SubjectAccessReview for the verb (the
controller's `AccessReviews`, with the caller's groups).

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

from corral.kube.access import AccessReviews
from corral.kube.client import AsyncApi, path_of

TTL_S = 10.0
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Caller:
    username: str
    groups: tuple[str, ...]


class Unauthenticated(Exception):
    pass


class Reviews:
    def __init__(self, api: AsyncApi, access: AccessReviews, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.access = access
        self.ttl_s = ttl_s
        self._clock = clock
        self._tokens: dict[str, tuple[float, Caller | None]] = {}

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
            caller = Caller(user["username"], tuple(user.get("groups") or ())) \
                if status.get("authenticated") and user.get("username") else None
            if len(self._tokens) >= MAX_ENTRIES:
                self._tokens.clear()
            hit = self._tokens[key] = (self._clock() + self.ttl_s, caller)
        if hit[1] is None:
            raise Unauthenticated("the API server does not accept this token")
        return hit[1]

    async def may(self, caller: Caller, verb: str, namespace: str | None, device: str | None = None) -> bool:
        """May the caller do `verb` on corral.dev devices in `namespace` (None: cluster-wide), or on that one
        device? The controller's own SubjectAccessReviews, with the caller's groups, and their cache."""
        return await self.access.may(caller.username, verb, namespace, device, groups=list(caller.groups))

