"""Decisions the cluster has seen, held against the log: a cut after the newest checkpoint no longer hides."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.chain import digest, line_hash
from corral.audit.citations import Citation, RetainedLog, check
from corral.audit.log import AuditLog, Sealed, log_files, read_records


def sealed_log(tmp_path: Path, count: int) -> tuple[list[Sealed], list[str]]:
    """A log of `count` decisions: where each landed (as the controller cites it), and every line's hash."""
    audit = AuditLog(tmp_path / "audit", "controller", Ed25519PrivateKey.generate())
    audit.open()

    async def write() -> list[Sealed]:
        return [await audit.seal("intent.decided", f"home/req-{i}", {"code": "EXECUTED"}, uid=f"uid-{i}")
                for i in range(count)]

    sealed = asyncio.run(write())
    audit.close()
    lines = log_files(tmp_path / "audit")[0].read_bytes().splitlines()
    return sealed, [digest(line) for line in lines]


def test_the_citations_of_a_whole_log_all_check_out(tmp_path: Path) -> None:
    sealed, hashes = sealed_log(tmp_path, 6)
    assert [s.hash for s in sealed] == hashes and [s.seq for s in sealed] == [1, 2, 3, 4, 5, 6]
    assert [line_hash(r) for r in read_records(tmp_path / "audit")] == hashes  # what a restored decision cites
    citations = [Citation(f"home/req-{i}", s.seq, s.hash) for i, s in enumerate(sealed)]
    checked = check(citations, RetainedLog(1, hashes))
    assert (checked.ok, checked.found, checked.older) == (True, 6, 0)


def test_a_cut_tail_or_a_rewritten_record_fails_naming_the_intent(tmp_path: Path) -> None:
    sealed, hashes = sealed_log(tmp_path, 6)
    citations = [Citation(f"home/req-{i}", s.seq, s.hash) for i, s in enumerate(sealed)]
    cut = check(citations, RetainedLog(1, hashes[:4]))
    assert not cut.ok and cut.found == 4
    assert cut.problems[0].startswith(f"Intent home/req-4 cites its decision at seq 5 (hash {hashes[4][:12]}...), "
                                      "but the log ends at seq 4")
    assert "home/req-5" in cut.problems[1]
    rewritten = check(citations, RetainedLog(1, [*hashes[:2], "f" * 64, *hashes[3:]]))
    assert rewritten.problems == (f"Intent home/req-2 cites its decision at seq 3 (hash {hashes[2][:12]}...), but the "
                                  "log's record at seq 3 hashes to ffffffffffff...: the log was rewritten from there on",)


def test_records_deleted_by_retention_are_not_held_against_the_log(tmp_path: Path) -> None:
    sealed, hashes = sealed_log(tmp_path, 6)
    citations = [Citation(f"home/req-{i}", s.seq, s.hash) for i, s in enumerate(sealed)]
    checked = check(citations, RetainedLog(4, hashes[3:]))
    assert (checked.ok, checked.found, checked.older) == (True, 3, 3)
