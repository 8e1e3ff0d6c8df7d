"""Times as people and agents write them: "24h" (ago), "7d", "30m", "now", ISO 8601, or epoch milliseconds.

A tiny parser with errors that say what is allowed, since an agent learns the syntax from the error. A relative
time counts back from `now_ms` ("24h" is 24 hours before now; a leading "-" means the same, "now-24h" too).
An ISO time without an offset is taken as UTC (the store's buckets and days are UTC as well).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

UNITS_MS: Final = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_RELATIVE = re.compile(r"^(?:now)?-?(\d+(?:\.\d+)?)([smhdw])$")
ALLOWED: Final = ('a relative time like "30m", "24h", "7d" or "2w" (s, m, h, d, w; counted back from now), "now", '
                  'an ISO 8601 time like "2026-12-07T18:00:00Z" (UTC when no offset is given), or epoch milliseconds')


class TimeSyntaxError(ValueError):
    """A time that is none of the forms allowed; the message lists them."""


def parse_time(text: str | int, now_ms: int) -> int:
    """Epoch milliseconds for `text`."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if not value:
        raise TimeSyntaxError(f"empty time: give {ALLOWED}")
    if value == "now":
        return now_ms
    if value.isdigit():
        return int(value)
    relative = _RELATIVE.match(value)
    if relative:
        return now_ms - int(float(relative[1]) * UNITS_MS[relative[2]])
    if re.match(r"^-?\d+(\.\d+)?[a-z]+$", value):
        raise TimeSyntaxError(f"unknown unit in {text!r}: the units are s, m, h, d and w; give {ALLOWED}")
    try:
        parsed = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise TimeSyntaxError(f"{text!r} is not a time: give {ALLOWED}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def parse_range(start: str | int, end: str | int | None, now_ms: int) -> tuple[int, int]:
    """(start_ms, end_ms) with end defaulting to now; an end before its start is an error, not an empty answer."""
    start_ms = parse_time(start, now_ms)
    end_ms = now_ms if end is None else parse_time(end, now_ms)
    if end_ms <= start_ms:
        raise TimeSyntaxError(f"the end ({end!r}) must come after the start ({start!r})")
    return start_ms, end_ms
