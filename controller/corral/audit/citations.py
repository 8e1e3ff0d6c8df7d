"""Decisions that clients saw, held against the log: no silent window between checkpoints. Pure.

A checkpoint is signed every few minutes; a log cut after the newest one still verifies, since what is left
is a valid chain (audit.chain). Every Intent's final status, though, cites its decision record (status.audit:
seq and line hash), written with the status write that reveals the decision. So the cluster holds, for each
decision anyone could have seen, a pointer into the log: the log must still hold that record, with that
hash. The hash chain then vouches for everything before it. A checkpoint per group commit
would do the same at the cost of an API write per fsync; the citation rides on a write made anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Citation:
    """What an Intent's status says about its decision record."""

    intent: str  # namespace/name
    seq: int
    hash: str


@dataclass(frozen=True)
class Checked:
    found: int  # citations whose record is in the log as cited
    older: int  # citations of records before the retained log (deleted by retention, on record): not checkable
    problems: tuple[str, ...]  # one line per citation the log does not bear out, naming the Intent

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class RetainedLog:
    """The verified log as the check needs it: the line hashes of seq `first_seq` onwards, in order."""

    first_seq: int
    hashes: Sequence[str]

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.hashes) - 1

    def hash_at(self, seq: int) -> str | None:
        index = seq - self.first_seq
        return self.hashes[index] if 0 <= index < len(self.hashes) else None


def check(citations: Iterable[Citation], log: RetainedLog) -> Checked:
    found = older = 0
    problems: list[str] = []
    for cited in sorted(citations, key=lambda c: c.seq):
        if cited.seq < log.first_seq:
            older += 1
            continue
        line_hash = log.hash_at(cited.seq)
        where = f"Intent {cited.intent} cites its decision at seq {cited.seq} (hash {cited.hash[:12]}...)"
        if line_hash is None:
            problems.append(f"{where}, but the log ends at seq {log.last_seq}: records the cluster has seen were "
                            "cut off")
        elif line_hash != cited.hash:
            problems.append(f"{where}, but the log's record at seq {cited.seq} hashes to {line_hash[:12]}...: the "
                            "log was rewritten from there on")
        else:
            found += 1
    return Checked(found, older, tuple(problems))


def check_chains(citations: Iterable[Citation], logs: Sequence[RetainedLog]) -> Checked:
    """The citations against several chains (one per controller replica, each with its own seq): a citation is
    borne out when any chain holds its record with its hash. Status does not say which replica decided, but a line
    hash names one record of one chain. One chain: exactly `check`."""
    if len(logs) == 1:
        return check(citations, logs[0])
    found = older = 0
    problems: list[str] = []
    for cited in sorted(citations, key=lambda c: c.seq):
        if any(log.hash_at(cited.seq) == cited.hash for log in logs):
            found += 1
        elif any(cited.seq < log.first_seq for log in logs):
            older += 1  # may be in a part of a chain deleted by retention: not checkable
        else:
            ends = ", ".join(str(log.last_seq) for log in logs)
            problems.append(f"Intent {cited.intent} cites its decision at seq {cited.seq} (hash {cited.hash[:12]}...), "
                            f"but no chain holds that record (the chains end at seq {ends}): records the cluster has "
                            "seen were cut off, or a log was rewritten")
    return Checked(found, older, tuple(problems))
