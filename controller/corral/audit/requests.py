"""What the audit log says each Intent name was last used for: idempotency after the Intent is gone. Pure.

The Intent name is the idempotency key. While the earlier Intent exists the API server refuses a second one
of that name, and the client compares the two (decide.idempotency). A finished Intent is deleted after its
retention (an hour by default), yet a replay must still be answered DEDUP (the same request: the earlier
outcome, nothing runs again) or DENY_ID_CONFLICT (other content under a used name) for the idempotency
window (a day). So every `intent.decided` record carries the request's identity hash, and this index keeps,
by namespace/name, the first decision of the window: its Intent's UID, that hash, its code and when, and the
states before and after it (what the same request is answered with again).

Unlike the decision index (audit.decisions), it is not pruned to the Intents that exist: deleted Intents are
what it is for. It is loaded at start from the records of the window, in every file the log still has
(so rotation loses nothing), and kept current from each new record. A replay's own answer (DEDUP,
DENY_ID_CONFLICT) is a decision record too, but never replaces the entry: the original outcome stays what
every later replay is compared with. Records of older versions without the hash, and dry runs (an answer
about what would happen, kept ten minutes), are not entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from corral.audit.chain import AuditRecord
from corral.audit.decisions import DECIDED

IDEMPOTENCY_WINDOW = timedelta(hours=24)  # as long as finished Intents were kept before retention (`--intent-ttl`)
IDENTITY = "identity"  # the record's field: decide.idempotency.identity_hash of the Intent's spec
REPLAY_OF = "replayOf"  # a replay's record names the Intent it was compared with
REPLAY_CODES = frozenset({"DEDUP", "DENY_ID_CONFLICT"})


@dataclass(frozen=True, slots=True)
class Earlier:
    """The decision a name stands for within the window."""

    uid: str
    identity: str
    code: str
    decided_at: datetime
    before: Any = None
    after: Any = None


class RequestNames:
    """namespace/name -> the earlier Intent's decision, for the idempotency window."""

    def __init__(self, window: timedelta = IDEMPOTENCY_WINDOW) -> None:
        if window <= timedelta(0):
            raise ValueError(f"the idempotency window must be longer than 0 s, not {window.total_seconds():g} s")
        self.window = window
        # In the order entries were made, which is (nearly) the order of their times: expired ones are cut from
        # the front, so the index holds about one window's worth of names and no more.
        # (An OrderedDict: cutting a plain dict's front again and again makes finding its first entry slow.)
        self._by_name: OrderedDict[str, Earlier] = OrderedDict()

    def load(self, records: Iterable[AuditRecord]) -> None:
        for record in records:
            self.add(record)

    def add(self, record: AuditRecord) -> None:
        entry = _entry(record)
        if entry is None:
            return
        current = self._by_name.get(record.subject)
        if current is not None and current.uid != entry.uid and entry.decided_at - current.decided_at < self.window:
            return  # the name's first decision of the window stands
        self._by_name[record.subject] = entry
        self._by_name.move_to_end(record.subject)  # the order stays that of the entries' times
        self.expire(entry.decided_at)

    def earlier(self, name: str, uid: str, now: datetime) -> Earlier | None:
        """The decision of another Intent of this namespace/name within the window, if there is one."""
        found = self._by_name.get(name)
        if found is None or found.uid == uid or now - found.decided_at >= self.window:
            return None
        return found

    def expire(self, now: datetime) -> None:
        """Forget entries older than the window (from the oldest; one made out of order waits its turn)."""
        while self._by_name:
            oldest = next(iter(self._by_name.values()))
            if now - oldest.decided_at < self.window:
                return
            self._by_name.popitem(last=False)

    def __len__(self) -> int:
        return len(self._by_name)


def _entry(record: AuditRecord) -> Earlier | None:
    data = record.data
    identity, code = data.get(IDENTITY), data.get("code")
    if (record.kind != DECIDED or not record.uid or not isinstance(identity, str) or not isinstance(code, str)
            or code in REPLAY_CODES or data.get("dryRun")):
        return None
    return Earlier(record.uid, identity, code, record.at, data.get("before"), data.get("after"))
