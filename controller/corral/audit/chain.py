"""The audit log's chain: records that are signed, linked by hash, and checked line by line. Pure.

The first piece of the durable audit (issue 16): the format and its verification, without I/O. Writing
(group commit, fsync), checkpoints in Kubernetes and the HTTPS reader build on it.

One record per line, canonical JSON (sorted keys, no spaces, UTF-8). Each record names the previous
line's SHA-256 (`prev`) and carries an Ed25519 signature (`sig`) over its own canonical form without
`sig`, made with the controller's audit key. So:

- an edited record fails its signature, and its successor's `prev` no longer matches;
- a deleted, swapped or inserted record breaks the sequence numbers (`seq`) and the links;
- a forged record fails its signature, since only the controller holds the key;
- a truncated tail leaves a valid prefix: only a checkpoint (audit.checkpoint) can tell, because it
  names the sequence number and hash the log had reached.

`verify_lines()` names the first record that is not what it should be, and why.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

GENESIS = "0" * 64  # the `prev` of the very first record of a log


class AuditRecord(BaseModel):
    """One fact, as it is kept. `data` holds the fact's own fields (its kind says which)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    seq: int = Field(ge=1, description="1, 2, 3, ... across the whole log, rotated files included")
    at: datetime = Field(description="When the fact happened (UTC)")
    kind: str = Field(pattern=r"^[a-z][a-z_.]{0,63}$", description="e.g. intent.decided, command.sent")
    subject: str = Field(max_length=512, description="What it is about: namespace/name of the Intent or Device")
    uid: str | None = Field(default=None, max_length=64, description="The subject's UID, when it has one")
    trace: str | None = Field(default=None, max_length=64, description="The trace id, where one exists")
    data: dict[str, Any] = Field(default_factory=dict)
    prev: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the previous line")
    key: str = Field(max_length=64, description="Name of the key that signed it")
    sig: str = Field(default="", description="Ed25519 signature (base64) of the record without sig")


def canonical(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def line_hash(record: AuditRecord) -> str:
    """The SHA-256 of the record's line (its canonical form, as the verifier insists it is written)."""
    return digest(canonical(record.model_dump(mode="json")))


def _unsigned(record: AuditRecord) -> bytes:
    return canonical(record.model_dump(mode="json", exclude={"sig"}))


@dataclass
class Chain:
    """Where the log stands: the next record's sequence number and `prev`."""

    seq: int = 0
    head: str = GENESIS

    def next(self, kind: str, subject: str, at: datetime, data: Mapping[str, Any], key_name: str,
             key: Ed25519PrivateKey, uid: str | None = None, trace: str | None = None) -> bytes:
        """The next record's line, sealed; the chain moves on to it."""
        return self.next_record(kind, subject, at, data, key_name, key, uid, trace)[1]

    def next_record(self, kind: str, subject: str, at: datetime, data: Mapping[str, Any], key_name: str,
                    key: Ed25519PrivateKey, uid: str | None = None, trace: str | None = None
                    ) -> tuple[AuditRecord, bytes]:
        """The next record and its sealed line; the chain moves on to it.

        The hot path of every decision, so the line is built as the model would dump it (the verifier
        parses it with the model and insists on exactly this form), without building the model twice."""
        if not _KIND.match(kind) or len(subject) > 512 or len(uid or "") > 64 or len(trace or "") > 64:
            raise ValueError(f"not a valid audit record: kind {kind!r}, subject of {len(subject)} characters")
        body: dict[str, Any] = {
            "v": 1, "seq": self.seq + 1, "at": _json_time(at), "kind": kind, "subject": subject, "uid": uid,
            "trace": trace, "data": json.loads(canonical(data)), "prev": self.head, "key": key_name,
        }
        body["sig"] = base64.b64encode(key.sign(canonical(body))).decode()
        line = canonical(body)
        self.seq, self.head = body["seq"], digest(line)
        return AuditRecord.model_construct(**{**body, "at": at}), line


_KIND = re.compile(r"^[a-z][a-z_.]{0,63}$")


def _json_time(at: datetime) -> str:
    """A UTC time as pydantic writes it in JSON: ISO 8601 with Z."""
    if at.tzinfo is None:
        raise ValueError("audit times are timezone-aware (UTC)")
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Broken:
    """The first record that is not what it should be: its line number (1-based), its seq if readable."""

    line: int
    seq: int | None
    why: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (f" (seq {self.seq})" if self.seq is not None else "")
        return f"{where}: {self.why}"


@dataclass(frozen=True)
class Verified:
    records: int
    last: Chain  # seq and hash of the last good record
    broken: Broken | None = None

    @property
    def ok(self) -> bool:
        return self.broken is None


def verify_lines(lines: Iterable[bytes], keys: Mapping[str, Ed25519PublicKey], start: Chain | None = None) -> Verified:
    """Check every line in order against the chain so far (`start`: where a previous file ended)."""
    chain = Chain(start.seq, start.head) if start is not None else Chain()
    count = 0
    for number, raw in enumerate(lines, 1):
        line = raw.rstrip(b"\n")
        broken = _check(line, chain, keys)
        if broken is not None:
            return Verified(count, chain, Broken(number, broken[0], broken[1]))
        chain.seq, chain.head = chain.seq + 1, digest(line)
        count += 1
    return Verified(count, chain)


def _check(line: bytes, chain: Chain, keys: Mapping[str, Ed25519PublicKey]) -> tuple[int | None, str] | None:
    try:
        record = AuditRecord.model_validate_json(line)
    except ValidationError as err:
        return None, f"not an audit record ({err.errors()[0]['msg']})"
    expected = chain.seq + 1
    if record.seq != expected:
        what = ("a record is missing here, or out of order" if record.seq > expected
                else "records are out of order or repeated")
        return record.seq, f"seq {record.seq} where {expected} was due: {what}"
    if record.prev != chain.head:
        return record.seq, (f"it does not follow the line before it (prev {record.prev[:12]}..., the line before "
                            f"hashes to {chain.head[:12]}...): that line was changed or replaced")
    public = keys.get(record.key)
    if public is None:
        return record.seq, f"signed by key {record.key!r}, which is not trusted (trusted: {', '.join(keys) or 'none'})"
    try:
        public.verify(base64.b64decode(record.sig, validate=True), _unsigned(record))
    except (InvalidSignature, ValueError):
        return record.seq, "its signature does not match its content: the record was changed or forged"
    if canonical(record.model_dump(mode="json")) != line:
        return record.seq, "it is not in canonical form: the line was rewritten"
    return None
