"""What the audit log says was decided, by Intent UID: so that no Intent is ever decided twice. Pure.

A decision is on disk (fsynced) before the status write that reveals it. A controller killed between the
two comes back to an Intent whose status says nothing yet, while its log already holds the decision. At
start-up the controller reads back the log's recent records into this index; an Intent found in it is
given the recorded outcome (or resumes the recorded execution, with its command id), never judged again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from corral.audit.chain import AuditRecord

DECIDED = "intent.decided"  # the final code, with before and after
EXECUTING = "intent.executing"  # decided to execute: the command id and the state before


@dataclass
class DecisionIndex:
    decided: dict[str, AuditRecord] = field(default_factory=dict)
    executing: dict[str, AuditRecord] = field(default_factory=dict)

    def load(self, records: Iterable[AuditRecord]) -> None:
        for record in records:
            self.add(record)

    def add(self, record: AuditRecord) -> None:
        if record.uid is None:
            return
        if record.kind == DECIDED:
            self.decided[record.uid] = record
            self.executing.pop(record.uid, None)
        elif record.kind == EXECUTING:
            self.executing[record.uid] = record

    def keep_only(self, uids: set[str]) -> None:
        """Forget Intents that no longer exist (deleted after their TTL)."""
        for index in (self.decided, self.executing):
            for uid in [u for u in index if u not in uids]:
                del index[uid]

    def forget(self, uid: str) -> None:
        self.decided.pop(uid, None)
        self.executing.pop(uid, None)

    def __len__(self) -> int:
        return len(self.decided) + len(self.executing)
