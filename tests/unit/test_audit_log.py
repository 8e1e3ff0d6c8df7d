"""The audit log on disk (audit.log): group commit, crash-torn tails, rotation, and a disk that says no."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.chain import AuditRecord, verify_lines
from corral.audit.log import AuditLog, InUse, log_files, read_records
from corral.cli.main import cli

KEY = Ed25519PrivateKey.generate()
TRUSTED = {"c1": KEY.public_key()}


def verify_all(directory: Path) -> tuple[bool, int]:
    start, total = None, 0
    for path in log_files(directory):
        verified = verify_lines(path.read_bytes().splitlines(), TRUSTED, start)
        if not verified.ok:
            return False, total
        start, total = verified.last, total + verified.records
    return True, total


def test_a_burst_is_written_with_few_fsyncs_and_every_caller_gets_its_seq(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path, "c1", KEY)
    audit.open()

    async def burst() -> list[int]:
        return list(await asyncio.gather(*(audit.append("intent.decided", f"home/req-{i}", {"i": i})
                                           for i in range(200))))

    seqs = asyncio.run(burst())
    assert sorted(seqs) == list(range(1, 201))
    assert audit.fsyncs <= 3, f"{audit.fsyncs} fsyncs for one burst"
    assert verify_all(tmp_path) == (True, 200)


def test_a_reopened_log_continues_its_chain_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path, "c1", KEY)
    audit.open()
    asyncio.run(audit.append("command.sent", "home/lamp", {"id": "i-1"}))
    with open(log_files(tmp_path)[-1], "ab") as out:
        out.write(b'{"v":1,"seq":2,"kind":"comm')  # a crash in the middle of a write
    audit.close()
    again = AuditLog(tmp_path, "c1", KEY)
    again.open()
    assert asyncio.run(again.append("ack.received", "home/lamp", {"id": "i-1"})) == 2
    assert verify_all(tmp_path) == (True, 2)


def test_a_full_file_rotates_and_the_chain_runs_across_files(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path, "c1", KEY, max_bytes=2000)
    audit.open()

    async def many() -> None:
        for i in range(30):
            await audit.append("state.changed", "home/lamp", {"power": i % 2 == 0})

    asyncio.run(many())
    assert len(log_files(tmp_path)) > 3
    assert verify_all(tmp_path) == (True, 30)
    audit.close()
    reopened = AuditLog(tmp_path, "c1", KEY, max_bytes=2000)
    reopened.open()
    assert reopened.chain == audit.chain


CHILD = """
import asyncio, resource, signal, sys
from pathlib import Path
from cryptography.hazmat.primitives import serialization
import corral.audit.log
from corral.audit.log import AuditLog
key = serialization.load_pem_private_key(sys.stdin.buffer.read(), password=None)
audit = AuditLog(Path(sys.argv[1]), "c1", key)
audit.open()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
async def main():
    first = await audit.append("intent.decided", "home/a", {"n": 1})
    resource.setrlimit(resource.RLIMIT_FSIZE, (600, resource.RLIM_INFINITY))
    try:
        await audit.append("intent.decided", "home/b", {"n": "x" * 2000})
        print("written")
    except OSError as err:
        print("refused", audit.writable, err)
    # Facts nobody waits for, noted during the outage: kept, and beyond the backlog counted.
    corral.audit.log.MAX_BACKLOG = 5
    for i in range(8):
        audit.note("command.sent", "home/lamp", {"i": i})
    await audit.flush()
    print("lost", audit.lost, len(audit._pending))
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("then", await audit.append("intent.decided", "home/b", {"n": 2}), audit.writable)
asyncio.run(main())
"""


def test_a_disk_that_refuses_the_write_is_told_to_every_caller_and_nothing_is_half_written(tmp_path: Path) -> None:
    pem = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], input=pem, capture_output=True, timeout=60)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "refused False" in out and "cannot be written" in out, out
    assert "lost 3 5" in out, out
    # After the outage: what failed, the three facts that gave way, the five kept, then the new record.
    kinds = [r.kind for r in read_records(tmp_path)]
    assert kinds == ["intent.decided", "audit.recovered", "audit.lost", *["command.sent"] * 5, "intent.decided"]
    assert [r.data["i"] for r in read_records(tmp_path) if r.kind == "command.sent"] == [3, 4, 5, 6, 7]
    assert "then 9 True" in out, "the record after the failure takes the next seq: nothing was skipped"
    assert verify_all(tmp_path) == (True, 9)


def test_a_second_writer_of_the_same_log_is_refused(tmp_path: Path) -> None:
    first = AuditLog(tmp_path, "c1", KEY)
    first.open()
    second = AuditLog(tmp_path, "c1", KEY)
    with pytest.raises(InUse, match="in use by another process"):
        second.open()
    first.close()
    second.open()  # free again once the first let go


def test_retention_deletes_the_oldest_files_on_record_and_what_is_left_still_verifies(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path, "c1", KEY, max_bytes=1500)
    audit.open()

    async def fill_and_retain() -> list[str]:
        for i in range(40):
            await audit.append("device.state_changed", "home/lamp", {"power": i % 2 == 0})
        return await audit.retain(max_age_s=None, max_total_bytes=8000)

    deleted = asyncio.run(fill_and_retain())
    assert deleted == [f"audit-{i:06d}.jsonl" for i in range(1, len(deleted) + 1)], "only the oldest files go"
    assert deleted
    left = log_files(tmp_path)
    assert all(p.name not in deleted for p in left)
    [retention] = [r for r in read_records(tmp_path) if r.kind == "audit.retention"]
    assert retention.data["deleted"] == deleted and retention.data["firstSeq"] == 1
    key = tmp_path / "c1.pem"
    key.write_bytes(KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(tmp_path), "--key", str(key)])
    assert done.exit_code == 0, done.output
    assert f"seq {retention.data['lastSeq'] + 1}-41" in done.output and "deleted by retention" in done.output
    # The same files deleted without the record: the gap is named.
    retained = next(p for p in left if any(r.kind == "audit.retention" for r in read_records_of(p)))
    lines = retained.read_bytes().splitlines()
    retained.write_bytes(b"\n".join(line for line in lines if b'"audit.retention"' not in line) + b"\n")
    done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(tmp_path), "--key", str(key)])
    assert done.exit_code == 1 and "gone without a retention record" in done.output, done.output


def read_records_of(path: Path) -> list[AuditRecord]:
    return [AuditRecord.model_validate_json(line) for line in path.read_bytes().splitlines() if line.strip()]
