"""Checkpoints: the controller's signed word on how far the audit log had reached. Pure.

A hash chain cannot show that its tail was cut off: the rest is still a valid chain. So at a fixed
interval, and when it stops, the controller signs a checkpoint naming the last record's seq and hash.
Checkpoints are numbered and chained to each other, and (in the later parts of issue 16) published as a
Kubernetes object, so someone with only API access can hold the log to them.

Presenting an older genuine checkpoint over a truncated log is caught by age: a running controller makes
a new checkpoint every interval, so one older than `max_age` that is not the controller's last word
(`final`, written when it stops) cannot be the newest. After a `final` checkpoint nothing may follow.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from datetime import datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field

from corral.audit.chain import GENESIS, AuditRecord, Broken, Chain, Verified, canonical, digest, verify_lines


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int = Field(ge=1)
    seq: int = Field(ge=0, description="The last record it covers")
    head: str = Field(pattern=r"^[0-9a-f]{64}$", description="That record's line hash")
    at: datetime
    previous: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hash of the checkpoint before, or zeros")
    final: bool = Field(default=False, description="Written as the controller stopped: nothing may follow")
    key: str
    sig: str = ""

    def unsigned(self) -> bytes:
        return canonical(self.model_dump(mode="json", exclude={"sig"}))

    def digest(self) -> str:
        return digest(canonical(self.model_dump(mode="json")))


def sign_checkpoint(chain: Chain, number: int, at: datetime, previous: Checkpoint | None, key_name: str,
                    key: Ed25519PrivateKey, final: bool = False) -> Checkpoint:
    unsigned = Checkpoint(number=number, seq=chain.seq, head=chain.head, at=at, final=final, key=key_name,
                          previous=previous.digest() if previous is not None else GENESIS)
    return unsigned.model_copy(update={"sig": base64.b64encode(key.sign(unsigned.unsigned())).decode()})


def checkpoint_problem(checkpoint: Checkpoint, keys: Mapping[str, Ed25519PublicKey], now: datetime,
                       max_age_s: float) -> str | None:
    """Why the checkpoint itself cannot be relied on, or None."""
    public = keys.get(checkpoint.key)
    if public is None:
        return f"checkpoint {checkpoint.number} is signed by key {checkpoint.key!r}, which is not trusted"
    try:
        public.verify(base64.b64decode(checkpoint.sig, validate=True), checkpoint.unsigned())
    except (InvalidSignature, ValueError):
        return f"checkpoint {checkpoint.number}'s signature does not match its content"
    age = (now - checkpoint.at).total_seconds()
    if not checkpoint.final and age > max_age_s:
        return (f"checkpoint {checkpoint.number} is {age:.0f} s old and not final, but a running controller signs one "
                f"every {max_age_s / 2:.0f} s: a newer one existed (an older checkpoint presented?)")
    return None


def verify_log(lines: Iterable[bytes], keys: Mapping[str, Ed25519PublicKey], checkpoint: Checkpoint | None,
               now: datetime, max_age_s: float, start: Chain | None = None) -> Verified:
    """The whole log against its newest checkpoint: the chain, then whether it reaches the checkpoint."""
    lines = [line.rstrip(b"\n") for line in lines]
    verified = verify_lines(lines, keys, start)
    if verified.broken is not None or checkpoint is None:
        return verified

    def broken(line: int, seq: int | None, why: str) -> Verified:
        return Verified(verified.records, verified.last, Broken(line, seq, why))

    problem = checkpoint_problem(checkpoint, keys, now, max_age_s)
    if problem is not None:
        return broken(0, checkpoint.seq, problem)
    if verified.last.seq < checkpoint.seq:
        return broken(len(lines) + 1, verified.last.seq + 1,
                      f"the log ends at seq {verified.last.seq} but checkpoint {checkpoint.number} covers seq "
                      f"{checkpoint.seq}: records were cut off")
    first = start.seq if start is not None else 0
    line = checkpoint.seq - first  # the covered record's line number; 0: where this file starts
    if line < 0:
        return verified  # the checkpoint covers an earlier file only
    head = digest(lines[line - 1]) if line >= 1 else (start.head if start is not None else GENESIS)
    if head != checkpoint.head:
        return broken(max(line, 1), checkpoint.seq, f"checkpoint {checkpoint.number} names another record at seq "
                                                    f"{checkpoint.seq}: the log was rewritten")
    if checkpoint.final and verified.last.seq > checkpoint.seq:
        return broken(line + 1, checkpoint.seq + 1, f"records follow the final checkpoint {checkpoint.number} (seq "
                                                    f"{checkpoint.seq}): written after the controller stopped")
    return verified


def retained_start(lines: Iterable[bytes]) -> tuple[Chain | None, str | None]:
    """Where the chain starts when old files were deleted: the `audit.retention` record that names the seq and
    hash the deleted part ended at (it is verified with the rest). (None, None) for a log that starts at seq 1;
    (None, why) when the start is missing without such a record."""
    records = []
    for line in lines:
        try:
            records.append(AuditRecord.model_validate_json(line))
        except ValueError:
            break  # verify_lines names it
    if not records or records[0].seq == 1:
        return None, None
    first = records[0].seq
    for record in records:
        if record.kind == "audit.retention" and record.data.get("lastSeq") == first - 1:
            return Chain(first - 1, str(record.data.get("lastHash"))), None
    return None, (f"the log starts at seq {first}: records 1-{first - 1} are gone without a retention record that "
                  "says they were deleted")
