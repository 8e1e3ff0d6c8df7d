"""The audit log on disk: append-only files of chained records, fsynced before anyone is told (group commit).

`await log.append(...)` returns once the record is on disk: a caller writes the status that reveals a
decision only after that. Records that arrive while a write is under way wait for the next one, so one
fsync covers a whole burst (group commit) and the hot path pays one fsync per burst, not per record.

Files are `audit-000001.jsonl`, `audit-000002.jsonl`, ... in one directory; a file that reaches
`max_bytes`, or is older than `max_file_age_s`, is closed and the next one continues the chain (its first
record's `prev` is the last hash of the one before). `retain()` deletes the oldest closed files past an
age or a total size, after writing a signed `audit.retention` record that names them and the seq and
hash they ended at: the verifier starts the chain there (audit.chain), so what is left still proves
itself, and nothing disappears without a trace. On open, the newest file's tail is read back to continue the chain; a last line
without its newline is what a crash mid-write leaves, was never acknowledged, and is cut off.

If a write fails (a full disk, a file size limit), every waiting caller gets the error and `writable`
turns False until a later write succeeds: the controller decides nothing new meanwhile. Facts nobody
waits for (`note()`: commands, acks, state changes) are kept and written again every second until the log
takes them; beyond `MAX_BACKLOG` of them the oldest give way, and the log says how many once it can
(an `audit.lost` record): never dropped in silence.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.chain import AuditRecord, Chain, digest
from corral.audit.keys import public_pem

log = logging.getLogger(__name__)

FILE_PATTERN = re.compile(r"^audit-(\d{6})\.jsonl$")
DEFAULT_MAX_BYTES = 64 * 2**20
MAX_BACKLOG = 10_000
RETENTION = "audit.retention"  # old files deleted: which, and the seq and hash they ended at
RECOVERED = "audit.recovered"  # the first record after an outage, naming what failed
RETRY_S = 1.0
NOTE_DELAY_S = 0.05  # a noted fact is on disk within this, or sooner with the next append


def log_files(directory: Path) -> list[Path]:
    """The log's files, oldest first."""
    return sorted(p for p in directory.iterdir() if FILE_PATTERN.match(p.name)) if directory.is_dir() else []


class InUse(RuntimeError):
    """Another process holds the log."""


class Unwritable(OSError):
    """The audit log cannot be written: nothing that needs a record may happen meanwhile."""


@dataclass(frozen=True)
class Sealed:
    """Where a record landed: its seq and its line's SHA-256. An Intent's final status cites its decision
    record so (status.audit), which closes the window between checkpoints: see `corral audit verify
    --against-cluster`."""

    seq: int
    hash: str


@dataclass
class _Pending:
    record: dict[str, Any]
    done: asyncio.Future[Sealed] | None  # None: a noted fact, kept until it is written


def read_records(directory: Path, since: datetime | None = None) -> Iterator[AuditRecord]:
    """The records on disk, oldest first; with `since`, files last written before it are skipped."""
    for path in log_files(directory):
        if since is not None and datetime.fromtimestamp(path.stat().st_mtime, UTC) < since:
            continue
        data = path.read_bytes()
        # Only whole lines: the newest file may be in the middle of a write.
        for line in data[:data.rfind(b"\n") + 1].splitlines():
            if line.strip():
                yield AuditRecord.model_validate_json(line)


class AuditLog:
    def __init__(self, directory: Path, key_name: str, key: Ed25519PrivateKey,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_file_age_s: float | None = None) -> None:
        self.directory = directory
        self.max_file_age_s = max_file_age_s
        self.key_name, self.key = key_name, key
        self.max_bytes = max_bytes
        self.chain = Chain()
        self.writable = True
        self.fsyncs = 0
        self.error = ""  # why it could not be written, while it cannot
        self.lost = 0  # noted facts that gave way while the log could not be written, not yet told
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._probe: asyncio.Future[Sealed] | None = None
        self._soon: asyncio.TimerHandle | None = None
        self._lock: int | None = None
        self._fd: int | None = None  # the newest file, open for appending (in the writer's thread)
        self._size = 0
        self._started: datetime | None = None  # when the newest file's first record was written
        self._file: Path | None = None
        self._listeners: list[Any] = []

    def open(self) -> None:
        """Continue the chain where the newest file ends (cutting a torn last line), and put the public key
        beside the files as NAME.pub.pem. Blocking: call it at start."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise InUse(f"audit log {self.directory} is in use by another process: two writers would fork its "
                        "chain; give each controller (and gateway) a directory of its own") from None
        # A copy for convenience; a verifier should take it from where the key is kept (corral audit public-key).
        public = self.directory / f"{self.key_name}.pub.pem"
        if not public.exists() or public.read_bytes() != public_pem(self.key):
            public.write_bytes(public_pem(self.key))
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

    def on_record(self, listener: Any) -> None:
        """Call listener(record) for every record once it is on disk (the decision index, the HTTPS reader)."""
        self._listeners.append(listener)

    async def append(self, kind: str, subject: str, data: Mapping[str, Any], *, uid: str | None = None,
                     trace: str | None = None, at: datetime | None = None) -> int:
        """Record a fact; returns its seq once it is on disk. Raises OSError when it could not be written."""
        return (await self.seal(kind, subject, data, uid=uid, trace=trace, at=at)).seq

    async def seal(self, kind: str, subject: str, data: Mapping[str, Any], *, uid: str | None = None,
                   trace: str | None = None, at: datetime | None = None) -> Sealed:
        """As `append`, and the record's line hash with its seq: what a status may cite."""
        done: asyncio.Future[Sealed] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(_fact(kind, subject, data, uid, trace, at), done))
        self._kick()
        return await done

    def note(self, kind: str, subject: str, data: Mapping[str, Any], *, uid: str | None = None,
             trace: str | None = None, at: datetime | None = None) -> None:
        """Record a fact nobody waits for: written with the next append's batch, or within NOTE_DELAY_S;
        kept and retried while the log cannot be written. (A decision's commands and acks so share its
        fsync, instead of making it wait behind a write of their own.)"""
        self._pending.append(_Pending(_fact(kind, subject, data, uid, trace, at), None))
        if self._soon is None and (self._writer is None or self._writer.done()):
            self._soon = asyncio.get_running_loop().call_later(NOTE_DELAY_S, self._write_soon)

    def _write_soon(self) -> None:
        self._soon = None
        self._kick()

    async def recovered(self) -> bool:
        """While the log cannot be written: try once (coalesced with every other caller's try) and say whether
        it can be again. The try is itself a record of the outage."""
        if self.writable:
            return True
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self.seal(RECOVERED, "audit", {"error": self.error}))
        try:
            await asyncio.shield(self._probe)
        except Unwritable:
            return False
        return True

    async def flush(self) -> None:
        """Wait until everything appended or noted so far was written (or failed)."""
        if self._pending:
            self._kick()
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    def close(self) -> None:
        for timer in (self._retry, self._soon):
            if timer is not None:
                timer.cancel()
        self._close_file()
        if self._lock is not None:
            os.close(self._lock)  # and with it the lock
            self._lock = None

    def _kick(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="audit-writer")

    async def _write_all(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            if self.lost:
                batch.insert(0, _Pending(_fact("audit.lost", "audit", {"records": self.lost, "why": (
                    "facts noted while the log could not be written, beyond the backlog of "
                    f"{MAX_BACKLOG}")}, None, None, None), None))
            if not self.writable and all(p.record["kind"] != RECOVERED for p in batch):
                # The outage on record, by the first batch that gets through.
                batch.insert(0, _Pending(_fact(RECOVERED, "audit", {"error": self.error}, None, None, None), None))
            before = Chain(self.chain.seq, self.chain.head)
            records, lines, heads = [], [], []
            for p in batch:
                record, line = self.chain.next_record(p.record["kind"], p.record["subject"], p.record["at"],
                                                      p.record["data"], self.key_name, self.key,
                                                      uid=p.record["uid"], trace=p.record["trace"])
                records.append(record)
                lines.append(line)
                heads.append(self.chain.head)  # the hash of this very line
            try:
                await asyncio.to_thread(self._write, lines)
            except OSError as err:
                self.chain = before  # nothing of the batch counts: it is written again by whoever retries
                if self.writable:
                    log.error("audit log %s cannot be written: %s; deciding nothing new until it can", self._file, err)
                self.writable, self.error = False, str(err)
                self._keep([p for p in batch if p.done is None and p.record["kind"] not in ("audit.lost", RECOVERED)])
                for pending in batch:
                    if pending.done is not None and not pending.done.done():
                        pending.done.set_exception(Unwritable(err.errno, f"the audit log cannot be written: {err}"))
                return  # the rest waits for the next append or the retry
            if not self.writable:
                log.warning("audit log %s is writable again", self._file)
            self.writable, self.lost, self.error = True, 0, ""
            for pending, record, head in zip(batch, records, heads, strict=True):
                for listener in self._listeners:
                    listener(record)
                if pending.done is not None and not pending.done.done():
                    pending.done.set_result(Sealed(record.seq, head))

    def _keep(self, noted: list[_Pending]) -> None:
        """Noted facts of a failed batch go first in line for the next write, at the latest a second from now."""
        self._pending = noted + self._pending
        over = sum(1 for p in self._pending if p.done is None) - MAX_BACKLOG
        if over > 0:
            self.lost += over
            oldest = [p for p in self._pending if p.done is None][:over]
            self._pending = [p for p in self._pending if all(p is not o for o in oldest)]
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(RETRY_S, self._retry_now)

    async def retain(self, max_age_s: float | None, max_total_bytes: int | None) -> list[str]:
        """Delete the oldest closed files last written more than `max_age_s` ago, or while all files together
        exceed `max_total_bytes`; only ever the oldest ones, so what is left is one unbroken chain. Returns
        the names deleted (after the retention record that names them is on disk)."""
        files = log_files(self.directory)
        closed = [f for f in files if f != self._file]
        total = sum(f.stat().st_size for f in files)
        now = datetime.now(UTC).timestamp()
        doomed: list[Path] = []
        for path in closed:
            stat = path.stat()
            too_old = max_age_s is not None and now - stat.st_mtime > max_age_s
            too_big = max_total_bytes is not None and total > max_total_bytes
            if not (too_old or too_big):
                break
            doomed.append(path)
            total -= stat.st_size
        if not doomed:
            return []
        with open(doomed[0], "rb") as file:
            first = AuditRecord.model_validate_json(file.readline())
        last_line = doomed[-1].read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        last = AuditRecord.model_validate_json(last_line)
        names = [p.name for p in doomed]
        await self.append(RETENTION, "audit", {
            "deleted": names, "firstSeq": first.seq, "lastSeq": last.seq, "lastHash": digest(last_line),
            "why": (f"older than {max_age_s:g} s" if max_age_s is not None else "") +
                   (f"; the log over {max_total_bytes} bytes" if max_total_bytes is not None else "")})
        for path in doomed:
            await asyncio.to_thread(path.unlink)
        log.info("audit log: deleted %s (seq %d-%d), on record as audit.retention", ", ".join(names), first.seq,
                 last.seq)
        return names

    def _retry_now(self) -> None:
        self._retry = None
        if self._pending:
            self._kick()

    def _write(self, lines: list[bytes]) -> None:
        """Append the lines and fsync them, in the writer's thread; the file stays open between batches."""
        assert self._file is not None, "open() the log first"
        if self._fd is None:
            self._open_file()
        if self._rotation_due():
            number = int(self._file.name[len("audit-"):-len(".jsonl")]) + 1
            self._close_file()
            self._file = self.directory / f"audit-{number:06d}.jsonl"
            self._open_file()
        assert self._fd is not None
        data = memoryview(b"".join(line + b"\n" for line in lines))
        written = len(data)
        try:
            while data:
                data = data[os.write(self._fd, data):]
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._size)  # leave no partial batch behind
            raise
        self._size += written
        if self._started is None:
            self._started = datetime.now(UTC)
        self.fsyncs += 1

    def _open_file(self) -> None:
        assert self._file is not None
        self._fd = os.open(self._file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size
        self._started = None
        if self._size:
            with open(self._file, "rb") as file:
                self._started = AuditRecord.model_validate_json(file.readline()).at

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rotation_due(self) -> bool:
        if self._size >= self.max_bytes:
            return True
        if self.max_file_age_s is None or self._started is None:
            return False
        return (datetime.now(UTC) - self._started).total_seconds() > self.max_file_age_s


def _fact(kind: str, subject: str, data: Mapping[str, Any], uid: str | None, trace: str | None,
          at: datetime | None) -> dict[str, Any]:
    return {"kind": kind, "subject": subject, "data": dict(data), "uid": uid, "trace": trace,
            "at": at or datetime.now(UTC)}
