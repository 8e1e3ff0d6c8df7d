"""What a Device's Lease object holds now: the holder's lease, or the one a person broke, or nothing.

Pure, so that the controller judging an Intent and `corral lease list` read a Lease the same way. The object's
words (label, annotations) are api/lease.py's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from corral.api.lease import BROKEN_AT, BROKEN_BY, BROKEN_REASON, HOLDER, HOLDER_ID, REASON, LeaseObject
from corral.contract.text import written_text
from corral.decide.decision import Broken, Lease


def parse(lease: LeaseObject | dict[str, Any]) -> tuple[Lease | None, Broken | None]:
    """The lease a Lease object holds now (None once broken), and the broken one it remembers."""
    obj = lease if isinstance(lease, LeaseObject) else LeaseObject.model_validate(lease)
    spec = obj.spec
    renewed = _time(spec.renew_time) or _time(spec.acquire_time)
    if renewed is None:
        return None, None
    until = renewed + timedelta(seconds=int(spec.lease_duration_seconds or 0))
    holder, holder_id = obj.annotation(HOLDER), obj.annotation(HOLDER_ID) or None
    # The holder's and the breaker's words reach other agents in their refusals: made safe as they are read.
    reason = written_text(obj.annotation(REASON))
    if obj.annotation(BROKEN_BY):
        return None, Broken(holder, holder_id, obj.annotation(BROKEN_BY), written_text(obj.annotation(BROKEN_REASON)),
                            _time(obj.annotation(BROKEN_AT)) or renewed, until)
    if not spec.holder_identity or not holder:
        return None, None
    return Lease(holder, until, reason, holder_id), None


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
