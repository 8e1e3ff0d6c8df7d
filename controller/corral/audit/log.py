"""The audit log on disk: append-only files of chained records, fsynced before anyone is told (group commit).

`await log.append(...)` returns once the record is on disk: a caller writes the status that reveals a
decision only after that. Records that arrive while a write is under way wait for the next one, so one
fsync covers a whole burst (group commit) and the hot path pays one fsync per burst, not per record.

Files are `audit-000001.jsonl`, `audit-000002.jsonl`, ... in one directory; a file that reaches
`max_bytes` is closed and the next one continues the chain (its first record's `prev` is the last hash
of the one before). On open, the newest file's tail is read back to continue the chain; a last line
without its newline is what a crash mid-write leaves, was never acknowledged, and is cut off.

If a write fails (a full disk, a file size limit), every waiting caller gets the error and `writable`
turns False until a later write succeeds: the controller decides nothing new meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.chain import AuditRecord, Chain, digest

log = logging.getLogger(__name__)

FILE_PATTERN = re.compile(r"^audit-(\d{6})\.jsonl$")
DEFAULT_MAX_BYTES = 64 * 2**20


def log_files(directory: Path) -> list[Path]:
    """The log's files, oldest first."""
    return sorted(p for p in directory.iterdir() if FILE_PATTERN.match(p.name)) if directory.is_dir() else []


@dataclass
class _Pending:
    record: dict[str, Any]
    done: asyncio.Future[int]


class AuditLog:
    def __init__(self, directory: Path, key_name: str, key: Ed25519PrivateKey,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = directory
        self.key_name, self.key = key_name, key
        self.max_bytes = max_bytes
        self.chain = Chain()
        self.writable = True
        self.fsyncs = 0
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._file: Path | None = None

    def open(self) -> None:
        """Continue the chain where the newest file ends (cutting a torn last line). Blocking: call it at start."""
        self.directory.mkdir(parents=True, exist_ok=True)
        files = log_files(self.directory)
        if not files:
            self._file = self.directory / "audit-000001.jsonl"
            return
        self._file = files[-1]
        data = self._file.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            log.warning("audit log %s ends in a torn record (%d bytes, never acknowledged): cut off",
                        self._file, len(data) - cut)
            with open(self._file, "r+b") as out:
                out.truncate(cut)
                os.fsync(out.fileno())
            data = data[:cut]
        last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1] if data.strip() else None
        if last is None and len(files) > 1:
            last = files[-2].read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        if last:
            self.chain = Chain(AuditRecord.model_validate_json(last).seq, digest(last))

    async def append(self, kind: str, subject: str, data: Mapping[str, Any], *, uid: str | None = None,
                     trace: str | None = None, at: datetime | None = None) -> int:
        """Record a fact; returns its seq once it is on disk. Raises OSError when it could not be written."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending({"kind": kind, "subject": subject, "data": dict(data), "uid": uid,
                                       "trace": trace, "at": at or datetime.now(UTC)}, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="audit-writer")
        return await done

    async def _write_all(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            before = Chain(self.chain.seq, self.chain.head)
            lines = [self.chain.next(p.record["kind"], p.record["subject"], p.record["at"], p.record["data"],
                                     self.key_name, self.key, uid=p.record["uid"], trace=p.record["trace"])
                     for p in batch]
            try:
                await asyncio.to_thread(self._write, lines)
            except OSError as err:
                self.chain = before  # nothing of the batch counts: it is written again by whoever retries
                if self.writable:
                    log.error("audit log %s cannot be written: %s; deciding nothing new until it can", self._file, err)
                self.writable = False
                for pending in batch:
                    if not pending.done.done():
                        pending.done.set_exception(OSError(err.errno, f"the audit log cannot be written: {err}"))
                continue
            if not self.writable:
                log.warning("audit log %s is writable again", self._file)
            self.writable = True
            for pending, seq in zip(batch, range(before.seq + 1, self.chain.seq + 1), strict=True):
                if not pending.done.done():
                    pending.done.set_result(seq)

    def _write(self, lines: list[bytes]) -> None:
        assert self._file is not None, "open() the log first"
        if self._file.exists() and self._file.stat().st_size >= self.max_bytes:
            number = int(self._file.name[len("audit-"):-len(".jsonl")]) + 1
            self._file = self.directory / f"audit-{number:06d}.jsonl"
        fd = os.open(self._file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            data = memoryview(b"".join(line + b"\n" for line in lines))
            try:
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # leave no partial batch behind
                raise
            self.fsyncs += 1
        finally:
            os.close(fd)
