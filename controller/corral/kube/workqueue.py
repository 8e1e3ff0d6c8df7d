"""The work queue every reconciler runs on, in the manner of client-go's.

- A key is queued at most once, handled by one worker at a time, and queued again if it was added while
  being handled (so no event is lost and no key is handled twice at once).
- A reconciler answers with a `Result`: done, or handle again after N seconds. Requeueing is an answer,
  not a side effect (controller-runtime's `reconcile.Result`).
- A reconciler that raises is retried with per-key exponential backoff, capped, and overall no faster than
  a token bucket allows: client-go's `DefaultControllerRateLimiter` (`default_rate_limiters.go`).

Everything here runs on the event loop; nothing is thread-safe, and nothing needs to be.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Result:
    """What a reconcile answers: `requeue_after` seconds until it wants to run again, or None when done."""

    requeue_after: float | None = None

    @classmethod
    def done(cls) -> Result:
        return _DONE

    @classmethod
    def after(cls, seconds: float) -> Result:
        return cls(max(0.0, seconds))

    def sooner(self, other: Result) -> Result:
        """The result that asks to run again first (done only if both are done)."""
        if self.requeue_after is None:
            return other
        if other.requeue_after is None:
            return self
        return self if self.requeue_after <= other.requeue_after else other


_DONE = Result(None)


class RateLimiter(Generic[K]):
    """Per-key exponential backoff (base * 2**failures, capped), max'ed with an overall token bucket.

    The bucket keeps a flood of failing keys from becoming a flood of retries; the per-key backoff keeps
    one broken key from retrying hot. `forget()` after a success starts the key's backoff over.
    """

    def __init__(self, base_s: float = 0.005, cap_s: float = 300.0, rate_per_s: float = 10.0, burst: int = 100,
                 clock: Callable[[], float] | None = None) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self.rate_per_s, self.burst = rate_per_s, burst
        self._clock = clock
        self._failures: dict[K, int] = {}
        self._tokens = float(burst)
        self._at: float | None = None
        # When the next token is free: reservations queue up behind each other, as golang.org/x/time/rate's.
        self._reserved_until = 0.0

    def when(self, key: K) -> float:
        """Seconds to wait before retrying key, counting this failure."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        backoff = min(self.cap_s, self.base_s * 2.0 ** min(failures, 64))
        return max(backoff, self._bucket_delay())

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def _bucket_delay(self) -> float:
        now = self._now()
        if self._at is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        start = max(now, self._reserved_until)
        self._reserved_until = start + 1 / self.rate_per_s
        return self._reserved_until - now

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()


class WorkQueue(Generic[K]):
    def __init__(self, name: str = "queue", rate_limiter: RateLimiter[K] | None = None) -> None:
        self.name = name
        self.rate_limiter: RateLimiter[K] = rate_limiter or RateLimiter()
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def active(self) -> int:
        return len(self._active)

    def add(self, key: K) -> None:
        """Handle key soon: now if idle, once more after the current run if it is being handled."""
        if self._closed:
            return
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay_s: float) -> None:
        """Queue key after delay_s; an earlier pending timer for the key wins."""
        if self._closed:
            return
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay_s
        existing = self._timers.get(key)
        if existing is not None and existing.when() <= when:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def add_rate_limited(self, key: K) -> float:
        """Queue key after its backoff (after a failure); returns the delay."""
        delay = self.rate_limiter.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self.rate_limiter.forget(key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        key = await self._queue.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


Reconcile = Callable[[K], Awaitable[Result]]


async def run_workers(queue: WorkQueue[K], reconcile: Reconcile[K], workers: int) -> None:
    """Serve the queue with `workers` concurrent loops until cancelled."""
    await asyncio.gather(*(_work(queue, reconcile) for _ in range(workers)))


async def _work(queue: WorkQueue[K], reconcile: Reconcile[K]) -> None:
    while True:
        key = await queue.get()
        try:
            result = await reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            # One key's failure must not stop the others; it is retried after its backoff.
            delay = queue.add_rate_limited(key)
            log.exception("%s: reconciling %s failed (attempt %d); retrying in %.2f s", queue.name, key,
                          queue.rate_limiter.failures(key), delay)
        else:
            queue.forget(key)
            if result.requeue_after is not None:
                queue.add_after(key, result.requeue_after)
        finally:
            queue.done(key)
