"""Who a caller is and what RBAC lets it do, asked of the API server with the caller's own client.

One SelfSubjectRulesReview per served namespace (evaluated locally by `access`) and one SelfSubjectReview for
the caller's name and groups, again every `refresh_s`: a changed RoleBinding changes what the caller sees
without a reconnect. These calls are the official client's (blocking, so on the gateway's threads: `blocking`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import kubernetes

from corral.client.intents import identity
from corral.gateway.access import Access, NamespaceAccess, rules_from_review
from corral.gateway.blocking import blocking
from corral.gateway.identity import Caller

log = logging.getLogger(__name__)

Who = tuple[str | None, tuple[str, ...]]  # username, groups


class AccessReview:
    def __init__(self, caller: Caller, client: Any, namespaces: list[str], refresh_s: float) -> None:
        self.caller = caller
        self.client = client  # the caller's kubernetes.client.ApiClient
        self.namespaces = namespaces
        self.refresh_s = refresh_s

    async def review(self) -> tuple[Who, Access]:
        return await blocking(self._review)

    async def keep_fresh(self, apply: Callable[[Who, Access], None], who: Callable[[], str | None]) -> None:
        """Review again every refresh_s and `apply` the answer; a review that fails keeps the last rules."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                apply(*await self.review())
            except Exception as err:  # noqa: BLE001 - keep serving the last known rules
                log.warning("view of %s: RBAC review failed, keeping the last rules: %s", who(), err)

    def _review(self) -> tuple[Who, Access]:
        client = self.client
        auth = kubernetes.client.AuthorizationV1Api(client)
        reviews = []
        for ns in self.namespaces:
            review = auth.create_self_subject_rules_review({"spec": {"namespace": ns}})
            rules = rules_from_review(client.sanitize_for_serialization(review.status))
            reviews.append(NamespaceAccess(ns, rules))
        try:
            me = identity(client)
            who: Who = (me.username, me.groups)
        except kubernetes.client.ApiException:
            who = (self.caller.key[:20], ())
        return who, Access.of(reviews)
