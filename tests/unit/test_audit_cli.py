"""`corral audit verify` and `corral audit show` on log files: the verdict a person gets, and where."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.checkpoint import sign_checkpoint
from corral.audit.log import AuditLog, log_files
from corral.cli.main import cli

KEY = Ed25519PrivateKey.generate()


def written(tmp_path: Path, records: int = 5) -> tuple[Path, Path, AuditLog]:
    directory = tmp_path / "audit"
    audit = AuditLog(directory, "controller", KEY)
    audit.open()

    async def write() -> None:
        for i in range(records):
            await audit.append("intent.decided", f"home/req-{i}", {"code": "EXECUTED", "device": "home/lamp"})

    asyncio.run(write())
    key = tmp_path / "controller.pem"
    key.write_bytes(KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return directory, key, audit


def test_an_untouched_log_verifies_and_says_what_it_covered(tmp_path: Path) -> None:
    directory, key, audit = written(tmp_path)
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(sign_checkpoint(audit.chain, 1, datetime.now(UTC), None, "controller", KEY)
                          .model_dump_json())
    done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(directory), "--key", str(key),
                                    "--checkpoint", str(checkpoint)])
    assert done.exit_code == 0, done.output
    assert "OK: 5 records in 1 file(s), seq 1-5, checkpoint 1 covers seq 5." in done.output


def test_verify_names_the_first_bad_record(tmp_path: Path) -> None:
    directory, key, _ = written(tmp_path)
    path = log_files(directory)[0]
    lines = path.read_bytes().splitlines()
    changed = json.loads(lines[2])
    changed["data"]["code"] = "DENY_SCOPE"
    path.write_bytes(b"\n".join([*lines[:2], json.dumps(changed, separators=(",", ":"), sort_keys=True).encode(),
                                 *lines[3:]]) + b"\n")
    done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(directory), "--key", str(key)])
    assert done.exit_code == 1
    assert "audit-000001.jsonl, line 3 (seq 3): its signature does not match its content" in done.output


def test_show_filters_by_intent_and_prints_json(tmp_path: Path) -> None:
    directory, _, _ = written(tmp_path)
    done = CliRunner().invoke(cli, ["audit", "show", "--file", str(directory), "--intent", "req-3", "-o", "json"])
    assert done.exit_code == 0, done.output
    [record] = [json.loads(line) for line in done.output.splitlines()]
    assert (record["seq"], record["subject"], record["data"]["code"]) == (4, "home/req-3", "EXECUTED")
    bad = CliRunner().invoke(cli, ["audit", "show", "--file", str(directory), "--since", "yesterday"])
    assert bad.exit_code == 2 and "use a number and s, m, h or d" in bad.output


def _edit(lines: list[bytes]) -> list[bytes]:
    changed = json.loads(lines[2])
    changed["data"]["code"] = "DENY_SCOPE"
    return [*lines[:2], json.dumps(changed, separators=(",", ":"), sort_keys=True).encode(), *lines[3:]]


def _forged(lines: list[bytes]) -> list[bytes]:
    """A record someone appends with their own key, correctly linked and numbered."""
    from corral.audit.chain import Chain, digest
    last = json.loads(lines[-1])
    chain = Chain(last["seq"], digest(lines[-1]))
    return [*lines, chain.next("intent.decided", "home/req-x", datetime.now(UTC), {"code": "EXECUTED"}, "controller",
                               Ed25519PrivateKey.generate())]


TAMPERING = {
    "edited": (_edit, "line 3 (seq 3): its signature does not match"),
    "deleted": (lambda lines: [*lines[:1], *lines[2:]], "line 2 (seq 3): seq 3 where 2 was due: a record is missing"),
    "swapped": (lambda lines: [lines[0], lines[2], lines[1], *lines[3:]], "line 2 (seq 3): seq 3 where 2 was due"),
    "truncated": (lambda lines: lines[:3], "line 4 (seq 4): the log ends at seq 3 but checkpoint 2 covers seq 5"),
    "forged": (_forged, "line 6 (seq 6): its signature does not match its content"),
}


@pytest.mark.parametrize("case", list(TAMPERING), ids=list(TAMPERING))
def test_verify_fails_for_each_kind_of_tampering_and_names_where(tmp_path: Path, case: str) -> None:
    directory, key, audit = written(tmp_path)
    older = sign_checkpoint(audit.chain, 1, datetime.now(UTC), None, "controller", KEY)
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(sign_checkpoint(audit.chain, 2, datetime.now(UTC), older, "controller", KEY).model_dump_json())
    path = log_files(directory)[0]
    tamper, where = TAMPERING[case]
    path.write_bytes(b"\n".join(tamper(path.read_bytes().splitlines())) + b"\n")
    done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(directory), "--key", str(key),
                                    "--checkpoint", str(checkpoint)])
    assert done.exit_code == 1
    assert f"audit-000001.jsonl, {where}" in done.output, done.output


def test_an_older_genuine_checkpoint_presented_over_a_truncated_log_fails(tmp_path: Path) -> None:
    directory, key, audit = written(tmp_path, records=3)
    old = tmp_path / "old.json"
    # Genuine, signed when the log had 3 records, 20 minutes ago; the log went on to 5, then was cut to 3.
    old.write_text(sign_checkpoint(audit.chain, 1, datetime.now(UTC) - timedelta(minutes=20), None, "controller", KEY)
                   .model_dump_json())

    async def more() -> None:
        for i in range(2):
            await audit.append("intent.decided", f"home/late-{i}", {"code": "EXECUTED"})

    asyncio.run(more())
    path = log_files(directory)[0]
    path.write_bytes(b"\n".join(path.read_bytes().splitlines()[:3]) + b"\n")
    done = CliRunner().invoke(cli, ["audit", "verify", "--file", str(directory), "--key", str(key),
                                    "--checkpoint", str(old)])
    assert done.exit_code == 1
    assert "checkpoint 1 is 1200 s old and not final" in done.output, done.output
