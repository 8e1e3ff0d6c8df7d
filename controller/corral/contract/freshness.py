"""How old a cited reading may be: derived from the interval its sensor declares, capped by the cluster. Pure.

A contract declares how often each sensor publishes (`interval_s`). A citation of a sample (an Intent's
`basedOn`) must have been received within FACTOR x that interval: 2.5 leaves room for one missed or late
sample plus the round trip of reading and citing it (a sample is at most one interval old when read, up to
another interval passes before the next one, and the half interval covers the caller's own latency and
jitter), while two missed samples in a row still make the citation stale. The cap is the cluster's, never the
device's: it keeps a device (or anything holding its credential) from making old data "fresh" by declaring a
long interval. A sensor that declares no interval keeps the cluster's default limit (`corral run
--freshness`). A person may set the limit of one Device's metric (`spec.freshness`); that choice is theirs
and is bounded only by the API's schema.
"""

from __future__ import annotations

from dataclasses import dataclass

FACTOR = 2.5
DEFAULT_LIMIT_S = 2.0
DEFAULT_CAP_S = 60.0


@dataclass(frozen=True)
class FreshnessRule:
    """The cluster's side of the limit: the default for sensors without an interval, and the cap."""

    default_s: float = DEFAULT_LIMIT_S
    cap_s: float = DEFAULT_CAP_S

    def limit_s(self, interval_s: float | None, override_s: float | None = None) -> float:
        """Seconds a sample may have been received before it is too old to cite."""
        if override_s is not None:
            return override_s
        if interval_s is None:
            return self.default_s
        return min(FACTOR * interval_s, self.cap_s)

    def widening(self, before_s: float | None, after_s: float | None) -> str | None:
        """Why a changed interval asks for more trust, or None: a lengthened interval always does (it is held
        like any contract change that trusts the device more, even while the cap hides it); an interval declared
        where none was, or dropped, only when older readings would count as fresh than before."""
        if before_s is not None and after_s is not None:
            if after_s > before_s:
                return f"interval lengthened ({before_s:g} -> {after_s:g} s: older readings would count as fresh)"
            return None
        old, new = self.limit_s(before_s), self.limit_s(after_s)
        if new > old:
            change = f"interval declared ({after_s:g} s)" if after_s is not None else "interval removed"
            return f"{change}: readings would count as fresh for {new:g} s instead of {old:g} s"
        return None


DEFAULT_RULE = FreshnessRule()
