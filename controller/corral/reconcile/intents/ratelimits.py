"""Which Intents each requester made, for its rate limit (decide.ratelimit judges; this only indexes).

Kept beside the Intent cache, by requester, so a decision looks at one requester's recent Intents rather than
every Intent the controller holds. What each Intent's state is (decided, refused by the limit, or not yet) is
read from the cache when asked: the controller's own status writes land there before their watch events.
The controller hands it Intents as models; a body as it came (a tool's, a test's) is read into one first.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from corral.api.codes import FINAL_PHASES
from corral.api.intent import LEASE_ACTIONS, OVERLAY_ACTIONS
from corral.decide.ratelimit import HORIZON_PERIODS, Limited, RateLimit, Request, State, judge
from corral.kube.cache import Key
from corral.kube.typed import Body, parse
from corral.reconcile.intents.facts import StoredIntent, created_at, status_of

# Phases that say the decision let it through the limit (what waits for a person, or runs, or ended).
_PASSED = frozenset({"AwaitingApproval", "Executing"}) | FINAL_PHASES
# Ends that take no slot: the limit's own refusal, and a replay of a deleted Intent's name answered from the audit
# log (reconcile/intents/replays.py), which sends nothing, as the client's DEDUP of an existing one made no Intent.
_NO_SLOT = frozenset({"RATE_LIMITED", "DEDUP", "DENY_ID_CONFLICT"})

Seen = StoredIntent | Body


def _read(intent: Seen) -> StoredIntent:
    return intent if isinstance(intent, StoredIntent) else parse(StoredIntent, intent)


def _key(intent: StoredIntent) -> Key:
    return intent.metadata.namespace or "", intent.metadata.name or ""


def limited_kind(intent: Seen) -> bool:
    """Whether the limit applies: requests that may send a device a command (not reads, the overlay, leases,
    dry runs)."""
    spec = _read(intent).spec
    action = spec.action
    return not spec.dry_run and action != "read" and action not in OVERLAY_ACTIONS and action not in LEASE_ACTIONS


def state_of(intent: Seen) -> State:
    status = status_of(_read(intent))
    if status.code in _NO_SLOT:
        return "limited"
    return "counted" if status.phase in _PASSED else "open"


class RequestIndex:
    """The keys of each requester's limited-kind Intents, with their creation times."""

    def __init__(self, limit: RateLimit, lookup: Callable[[Key], Seen | None]) -> None:
        self.limit = limit
        self._lookup = lookup  # the Intent cache: current Intents, with the controller's own writes
        self._by_requester: dict[str, dict[Key, datetime]] = {}

    def observe(self, event_type: str, seen: Seen) -> None:
        if not self.limit.on:
            return
        intent = _read(seen)
        if not limited_kind(intent):
            return
        requester, key = intent.spec.requester, _key(intent)
        if event_type == "DELETED":
            mine = self._by_requester.get(requester, {})
            mine.pop(key, None)
            if not mine:
                self._by_requester.pop(requester, None)
            return
        self._by_requester.setdefault(requester, {})[key] = created_at(intent)

    def verdict(self, seen: Seen) -> Limited | None:
        """Whether this Intent is beyond its requester's limit (None: not, or the limit does not apply)."""
        if not self.limit.on:
            return None
        intent = _read(seen)
        if not limited_kind(intent) or state_of(intent) == "counted":
            return None  # one already let through (waiting for a person, say) keeps its slot when decided again
        mine = Request(_key(intent), created_at(intent), "open")
        since = mine.created_at - self.limit.per * HORIZON_PERIODS
        others = []
        for key, created in (self._by_requester.get(intent.spec.requester) or {}).items():
            if not since <= created <= mine.created_at or key == mine.key:
                continue
            current = self._lookup(key)
            state = state_of(current) if current is not None else "counted"
            if state != "limited":  # a refusal takes no slot: a flood of them costs nothing here
                others.append(Request(key, created, state))
        return judge(others, mine, self.limit)
