"""The requester's rate limit, judged from the Intents themselves: pure, no I/O, no clock of its own.

The gateway refuses a caller's control calls beyond its limit early, but an agent's token is also good at the
API server, where Intents can be created directly. So the decision pipeline limits each requester too, with
the gateway's rule (a token bucket per requester: `calls` at once, refilled at `calls` per `per`), so that a
call the gateway let through is not refused again here.

The bucket is computed from the requester's Intents, not kept in memory: each counts at its
`creationTimestamp` (set by the API server, the same for everyone who looks), and one that is already decided
counts as it was decided (it took a slot unless it ended `RATE_LIMITED` itself). One that is not decided yet
takes a slot if the bucket has one at its creation, in a fixed order (creation time, then those already decided,
then by namespace and name). A restarted controller therefore reaches the same answers, and two workers
deciding at once do too. A replayed name is one Intent (the API server refuses a second object under it, and
the client answers DEDUP), so it is counted once.

Only requests that may reach a device count and are limited: reads, the overlay and leases never send a
command, and a dry run executes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

# How far back the bucket is computed: it starts full this long before the request. A bucket refills fully
# within `per`, so the answer only differs from one computed over all history for a requester that kept above
# its rate for that long, and then by at most what the refill would have given it anyway.
HORIZON_PERIODS = 2
# How many of the requests before it that took (or may take) a slot are replayed: a bucket that never dropped
# below its limit took at most `calls` + the refill of the horizon, 3 x calls; more than that only means it is
# empty. It bounds the work of one decision in a flood.
REPLAYED_PER_CALL = 4

State = Literal["counted", "limited", "open"]


@dataclass(frozen=True)
class RateLimit:
    """At most `calls` requests at once per requester, refilled at `calls` per `per`; calls 0: no limit."""

    calls: int = 0
    per: timedelta = timedelta(seconds=60)

    @property
    def on(self) -> bool:
        return self.calls > 0

    def describe(self) -> str:
        return f"{self.calls} per {self.per.total_seconds():g} s"

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """CALLS/SECONDS (30/60) or CALLS/min; 0/60 for none. ValueError says what is allowed."""
        calls, sep, per = text.strip().partition("/")
        try:
            seconds = 60.0 if per.strip() in ("min", "m") else float(per)
            parsed = cls(int(calls), timedelta(seconds=seconds))
        except ValueError:
            parsed = None
        if not sep or parsed is None or parsed.calls < 0 or seconds <= 0:
            raise ValueError(f"{text!r}: use CALLS/SECONDS (e.g. 30/60) or CALLS/min, CALLS a whole number >= 0 "
                             "(0 for no limit) and SECONDS above 0")
        return parsed


@dataclass(frozen=True)
class Request:
    """One of the requester's Intents as far as the limit is concerned."""

    key: tuple[str, str]  # (namespace, name): a fixed order among Intents created in the same second
    created_at: datetime
    state: State  # counted: decided and took a slot; limited: ended RATE_LIMITED; open: not decided yet


@dataclass(frozen=True)
class Limited:
    """The request is beyond the limit: how many slots were taken, and when the next one frees."""

    limit: RateLimit
    taken: int  # requests counted within `per` before this one
    frees_at: datetime


def judge(requests: Iterable[Request], mine: Request, limit: RateLimit) -> Limited | None:
    """Whether `mine` is beyond the requester's limit (None: it may go ahead), given the requester's other
    requests (in any order; `mine` among them or not)."""
    if not limit.on:
        return None
    mine = Request(mine.key, mine.created_at, "open")  # it is being decided: decided ones of its second go first
    rate = limit.calls / limit.per.total_seconds()  # slots per second
    since = mine.created_at - limit.per * HORIZON_PERIODS
    others = sorted((r for r in requests if r.key != mine.key and since <= r.created_at <= mine.created_at),
                    key=_order)
    before = [r for r in others if _order(r) < _order(mine) and r.state != "limited"][-REPLAYED_PER_CALL * limit.calls:]
    tokens, at = float(limit.calls), since
    for request in (*before, mine):
        tokens = min(float(limit.calls), tokens + (request.created_at - at).total_seconds() * rate)
        at = request.created_at
        if request is mine:
            break
        if request.state == "counted" or (request.state == "open" and tokens >= 1):
            tokens -= 1  # a decided one took its slot even if this count would have refused it: the limit holds
    if tokens >= 1:
        return None
    window = [r for r in others if r.state == "counted" and r.created_at > mine.created_at - limit.per]
    return Limited(limit, len(window), mine.created_at + timedelta(seconds=(1 - tokens) / rate))


def _order(request: Request) -> tuple[datetime, int, tuple[str, str]]:
    return request.created_at, 0 if request.state == "counted" else 1, request.key
