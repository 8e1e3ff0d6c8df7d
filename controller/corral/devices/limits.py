"""How much one device may say, and how what is over that is told: a token bucket and a burst's reports.

A device's firmware may be hostile or broken. Every message it sends on a topic that costs the controller
work downstream (an audit record, an Event, a status write) first takes a token from that device's
bucket; what finds none is dropped and only counted. The counts are told as a burst's few reports
(`BurstReports`): one when the burst starts, one a minute while it lasts, and one when it ends, with how
many were dropped since the last report, never more than `max_reports` in any `window_s` of time, so a
flood of 10,000 messages costs the log and the API server a handful of writes instead of 10,000.

Pure: the caller passes the time (time.monotonic()), so tests run without a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

# A device's own rhythm: firmware sends telemetry every few seconds and debounced events, so 2 messages a
# second sustained, with room for 20 at once (a restart reports its state, events and first samples
# together), is far above what a sound device sends and far below what a flood costs downstream.
DEFAULT_RATE = 2.0
DEFAULT_BURST = 20
# A burst ends after this long without a drop: short enough to say soon that it is over, long enough that
# a flood in bursts is told as one (and the reports stay at most MAX_REPORTS a minute whatever it does).
QUIET_S = 3.0
# While a burst lasts, its count is told this often ...
REPORT_INTERVAL_S = 60.0
# ... and never more than this many reports in any REPORT_INTERVAL_S: start, one while it lasts, end.
MAX_REPORTS = 3


@dataclass
class TokenBucket:
    """`burst` tokens at most, refilled at `rate` a second; each allowed message takes one."""

    rate: float = DEFAULT_RATE
    burst: float = DEFAULT_BURST
    tokens: float = -1.0  # -1: full, set on first use
    at: float = 0.0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError(f"a token bucket needs a rate above 0 and a burst of at least 1, got rate {self.rate} "
                             f"and burst {self.burst}")

    def available(self, now: float) -> float:
        if self.tokens < 0:
            return self.burst
        return min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)

    def take(self, now: float) -> bool:
        """Spend a token if there is one; False: over the limit."""
        tokens = self.available(now)
        if tokens < 1:
            self.tokens, self.at = tokens, now
            return False
        self.tokens, self.at = tokens - 1, now
        return True


Phase = Literal["started", "continuing", "ended"]


@dataclass(frozen=True)
class BurstReport:
    phase: Phase
    dropped: int  # since the previous report of this burst (the first report: 1, the drop that started it)
    total: int  # in this burst so far
    started: float  # when the burst started (the caller's clock)

    def words(self, what: str) -> str:
        """`what` names the messages, e.g. "event messages from light-1"."""
        if self.phase == "started":
            return f"Over the limit: {what} are dropped and counted, not recorded one by one"
        if self.phase == "continuing":
            return f"Still over the limit: {self.dropped} more {what} dropped ({self.total} in this burst)"
        return f"Back under the limit: {self.total} {what} were dropped in this burst ({self.dropped} since the " \
               "last report)"


@dataclass
class BurstReports:
    """When a burst of drops deserves a report, and what it says. Call `drop()` for each dropped message and
    `tick()` now and then (at `next_tick()`): each returns the report due now, or None."""

    quiet_s: float = QUIET_S
    interval_s: float = REPORT_INTERVAL_S
    max_reports: int = MAX_REPORTS
    # False: no report at the start, only the counts (each minute, and at the end): a short burst is one report.
    tell_start: bool = True
    active: bool = False
    started: float = 0.0
    total: int = 0
    unreported: int = 0
    last_drop: float = 0.0
    last_report: float = 0.0
    _start_due: bool = False
    _sent: deque[float] = field(default_factory=deque)

    def drop(self, now: float) -> BurstReport | None:
        if not self.active:
            self.active, self.started, self.total, self.unreported = True, now, 0, 0
            self._start_due = self.tell_start
            if not self.tell_start:
                self.last_report = now  # the first count a minute from now, or at the end
        self.total += 1
        self.unreported += 1
        self.last_drop = now
        return self._due(now)

    def tick(self, now: float) -> BurstReport | None:
        return self._due(now) if self.active else None

    def next_tick(self) -> float | None:
        """When tick() may have something to say (the caller's clock); None while there is no burst."""
        if not self.active:
            return None
        when = self.last_drop + self.quiet_s
        if self._sent and len(self._sent) >= self.max_reports:
            when = max(when, self._sent[0] + self.interval_s)
        return when

    def _due(self, now: float) -> BurstReport | None:
        if self._start_due:
            phase: Phase = "started"
        elif now - self.last_drop >= self.quiet_s:
            phase = "ended"
        elif self.unreported and now - self.last_report >= self.interval_s:
            phase = "continuing"
        else:
            return None
        while self._sent and now - self._sent[0] >= self.interval_s:
            self._sent.popleft()
        if len(self._sent) >= self.max_reports:
            return None  # told later, with what was dropped meanwhile
        self._sent.append(now)
        report = BurstReport(phase, self.unreported, self.total, self.started)
        self.unreported, self.last_report, self._start_due = 0, now, False
        if phase == "ended":
            self.active = False
        return report


class DeviceLimits:
    """A bucket and a burst's reports per device id: `admit()` each message, `tick()` at `next_tick()`."""

    def __init__(self, rate: float = DEFAULT_RATE, burst: int = DEFAULT_BURST, quiet_s: float = QUIET_S) -> None:
        TokenBucket(rate, burst)  # refuses a bad rate or burst now, not at the first message
        self.rate, self.burst, self.quiet_s = rate, burst, quiet_s
        self._buckets: dict[str, TokenBucket] = {}
        self._bursts: dict[str, BurstReports] = {}

    def admit(self, device_id: str, now: float) -> tuple[bool, BurstReport | None]:
        """Whether this message of the device is taken, and the report due now if it is not."""
        bucket = self._buckets.get(device_id)
        if bucket is None:
            bucket = self._buckets[device_id] = TokenBucket(self.rate, self.burst)
        if bucket.take(now):
            return True, None
        burst = self._bursts.get(device_id)
        if burst is None:
            burst = self._bursts[device_id] = BurstReports(quiet_s=self.quiet_s)
        return False, burst.drop(now)

    def tick(self, now: float) -> list[tuple[str, BurstReport]]:
        # Ended bursts are kept: the reports they sent still count against the next burst's window.
        due = []
        for device_id, burst in self._bursts.items():
            report = burst.tick(now)
            if report is not None:
                due.append((device_id, report))
        return due

    def next_tick(self) -> float | None:
        times = [t for t in (b.next_tick() for b in self._bursts.values()) if t is not None]
        return min(times) if times else None

    def forget(self, device_id: str) -> None:
        self._buckets.pop(device_id, None)
        self._bursts.pop(device_id, None)
