"""Events kept to what a person can read: client-go's EventCorrelator (tools/record/events_cache.go), in Python.

The kubelet's event recorder does two things before an Event reaches the API server, and so does ours:

- aggregation (EventAggregator): the same object, type and reason with more than `max_similar` different
  notes within `aggregate_s` are one story; the note becomes "(combined from similar events): ..." and
  every later one is told under that one key;
- a spam filter (EventSourceObjectSpamFilter): a token bucket per object (client-go: per source and
  object; our source is always this controller) of `burst` Events refilled one per `refill_s`; an Event
  that finds none is dropped.

Two differences. client-go posts a combined Event once and then only raises its count (a PATCH of the same
Event); ours are new Events each time, which the bucket bounds just the same. And, on purpose, our bucket is
per object *and reason*: in client-go a Pod's many BackOff Events can silence its one FailedMount; here a
device's StateChanged flood must never silence the Warning that says it floods (device.flooding,
device.refused), which is itself bounded at its source.

Pure: the caller passes the time (time.monotonic()).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from corral.devices.limits import TokenBucket

V = TypeVar("V")

# client-go's defaults (tools/record/events_cache.go): 25 Events at once, then one per 5 minutes; more than 10
# notes of one kind within 10 minutes are combined.
SPAM_BURST = 25
SPAM_REFILL_S = 300.0
AGGREGATE_MAX_SIMILAR = 10
AGGREGATE_S = 600.0
COMBINED_PREFIX = "(combined from similar events): "
# client-go's LRU size: objects beyond it are forgotten, oldest first (and get a full bucket again).
MAX_KEYS = 4096


@dataclass(frozen=True)
class EventKey:
    kind: str
    namespace: str | None
    name: str
    uid: str | None
    reason: str
    type_: str


@dataclass
class _Similar:
    notes: set[str] = field(default_factory=set)
    last: float = 0.0


class EventCorrelator:
    def __init__(self, burst: int = SPAM_BURST, refill_s: float = SPAM_REFILL_S,
                 max_similar: int = AGGREGATE_MAX_SIMILAR, aggregate_s: float = AGGREGATE_S,
                 max_keys: int = MAX_KEYS) -> None:
        self.burst, self.refill_s = burst, refill_s
        self.max_similar, self.aggregate_s = max_similar, aggregate_s
        self.max_keys = max_keys
        self._similar: OrderedDict[EventKey, _Similar] = OrderedDict()
        self._buckets: OrderedDict[EventKey, TokenBucket] = OrderedDict()
        self.skipped = 0

    def correlate(self, key: EventKey, note: str, now: float) -> str | None:
        """The note to post (combined once the kind is common), or None: drop this Event."""
        note = self._aggregate(key, note, now)
        bucket = _lru(self._buckets, key, self.max_keys, lambda: TokenBucket(1.0 / self.refill_s, self.burst))
        if not bucket.take(now):
            self.skipped += 1
            return None
        return note

    def _aggregate(self, key: EventKey, note: str, now: float) -> str:
        similar = _lru(self._similar, key, self.max_keys, _Similar)
        if now - similar.last > self.aggregate_s:
            similar.notes.clear()
        similar.last = now
        similar.notes.add(note)
        if len(similar.notes) < self.max_similar:
            return note
        similar.notes.pop()  # as client-go: the set stays at its limit, so it keeps combining
        return COMBINED_PREFIX + note


def _lru(cache: OrderedDict[EventKey, V], key: EventKey, limit: int, make: Callable[[], V]) -> V:
    """The key's value, made if missing; the least recently used keys beyond `limit` are forgotten."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = make()
        while len(cache) > limit:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return value
