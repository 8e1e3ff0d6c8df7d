"""Who may do what, asked of Kubernetes with SubjectAccessReviews, and remembered for a few seconds.

An Intent costs one review for its requester (and one per approver); a busy agent sends the same
question many times a second. Answers are kept for at most `ttl_s` (10 s by default), so an RBAC
change — a grant or a revocation — shows within that time; identical questions in flight share one
review. The cache is bounded; when full it starts over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from corral.kube.objects import Kube

Question = tuple[str, tuple[str, ...], str, str | None, str | None]  # user, groups, verb, namespace, device

DEFAULT_TTL_S = 10.0


def implied_groups(user: str) -> list[str]:
    """The groups Kubernetes gives a user by its name alone: what a review counts when no groups were recorded.

    Memberships from an identity provider (a certificate's O=, an OIDC groups claim) are known only to the API
    server, at the moment it authenticates a request; the controller learns them from what admission vouched for
    (`recorded_or_implied`), never from the name.
    """
    groups = ["system:authenticated"]
    if user.startswith("system:serviceaccount:"):
        namespace = user.split(":")[2] if user.count(":") >= 3 else ""
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    return groups


def recorded_or_implied(user: str, recorded: list[str] | None) -> list[str]:
    """The groups to review `user` with: those an admission policy bound to the writer's own when the object was
    written (Intent.spec.requesterGroups, Rule.spec.authorGroups, ...), else only those its name implies. A group
    the person has left since still counts until they write again: Kubernetes cannot say who is in a group."""
    return list(recorded) if recorded is not None else implied_groups(user)


class AccessReviews:
    def __init__(self, kube: Kube, ttl_s: float = DEFAULT_TTL_S, max_entries: int = 50_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._answers: dict[Question, tuple[float, bool]] = {}
        self._asking: dict[Question, asyncio.Future[bool]] = {}
        self.reviews = 0  # reviews actually sent, for tests and benchmarks

    async def may(self, user: str, verb: str, namespace: str | None, device: str | None,
                  groups: list[str] | None = None) -> bool:
        question = (user, tuple(recorded_or_implied(user, groups)), verb, namespace, device)
        hit = self._answers.get(question)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        asking = self._asking.get(question)
        if asking is not None:
            return await asyncio.shield(asking)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._asking[question] = future
        try:
            self.reviews += 1
            allowed = await self.kube.may(user, list(question[1]), verb, namespace, device)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as err:
            future.set_exception(err)
            future.exception()  # the waiters (if any) see it raised; unretrieved, it would be logged too
            raise
        finally:
            self._asking.pop(question, None)
        if len(self._answers) >= self.max_entries:
            self._answers.clear()
        self._answers[question] = (self._clock() + self.ttl_s, allowed)
        future.set_result(allowed)
        return allowed
