"""`corral audit verify` and `show` across the chains of several controller replicas (issue 31).

Each replica of the StatefulSet writes a chain of its own (its own seq from 1, its own checkpoints). Two chains are
written here with audit/log.py into directories named as the chart's PVCs would be copied: an Intent started by
replica 0, which then stopped, and resumed with the same command id by replica 1.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.checkpoint import sign_checkpoint
from corral.audit.log import AuditLog, log_files
from corral.cli.main import cli

KEY = Ed25519PrivateKey.generate()
T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
UID = "0f6c1e7a-5d2b-4c1e-9a8b-2f4e6d8c0a11"
COMMAND = "i-3b1f0c9d2e4a5b6c7d8e9f0a"

Fact = tuple[int, str, str, Mapping[str, Any], str | None]  # seconds after T0, kind, subject, data, uid

# Replica 0 decides to execute home/warm-up and sends its command, then stops; replica 1 takes the device over and
# resends the same command id, hears the ack and decides. Other work goes on in both chains meanwhile.
REPLICA_0: list[Fact] = [
    (0, "intent.decided", "home/other-0", {"code": "EXECUTED"}, "u-other-0"),
    (10, "intent.executing", "home/warm-up", {"commandId": COMMAND, "value": 21}, UID),
    (11, "command.sent", "home/thermostat", {"commandId": COMMAND, "cause": "intent home/warm-up"}, None),
    (12, "command.sent", "home/lamp", {"commandId": "c-lamp"}, None),
]
REPLICA_1: list[Fact] = [
    (5, "intent.decided", "home/other-1", {"code": "EXECUTED"}, "u-other-1"),
    (30, "command.sent", "home/thermostat", {"commandId": COMMAND, "cause": "intent home/warm-up (resumed)"}, None),
    (31, "ack.received", "home/thermostat", {"commandId": COMMAND, "ok": True}, None),
    (32, "intent.decided", "home/warm-up", {"code": "EXECUTED", "commandId": COMMAND}, UID),
]


def write_chain(directory: Path, facts: list[Fact]) -> AuditLog:
    audit = AuditLog(directory, "controller", KEY)
    audit.open()

    async def write() -> None:
        for seconds, kind, subject, data, uid in facts:
            await audit.append(kind, subject, data, uid=uid, at=T0 + timedelta(seconds=seconds))

    asyncio.run(write())
    return audit


def two_chains(tmp_path: Path) -> tuple[Path, Path, Path, AuditLog, AuditLog]:
    first, second = tmp_path / "audit-corral-controller-0", tmp_path / "audit-corral-controller-1"
    one, two = write_chain(first, REPLICA_0), write_chain(second, REPLICA_1)
    key = tmp_path / "controller.pem"
    key.write_bytes(KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return first, second, key, one, two


def checkpoint_of(tmp_path: Path, name: str, audit: AuditLog) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(sign_checkpoint(audit.chain, 1, datetime.now(UTC), None, "controller", KEY).model_dump_json())
    return path


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["audit", *args])


def test_each_chain_verifies_on_its_own_against_its_own_checkpoint(tmp_path: Path) -> None:
    first, second, key, one, two = two_chains(tmp_path)
    done = run("verify", "--file", str(first), "--file", str(second), "--key", str(key),
               "--checkpoint", str(checkpoint_of(tmp_path, "cp-0", one)),
               "--checkpoint", str(checkpoint_of(tmp_path, "cp-1", two)))
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines == [
        "chain audit-corral-controller-0: OK: 4 records in 1 file(s), seq 1-4, checkpoint 1 covers seq 4.",
        "chain audit-corral-controller-1: OK: 4 records in 1 file(s), seq 1-4, checkpoint 1 covers seq 4.",
        "OK: 2 chains, 8 records.",
    ], done.output


def test_a_break_in_one_chain_is_named_and_the_other_chain_still_said_ok(tmp_path: Path) -> None:
    first, second, key, _, _ = two_chains(tmp_path)
    path = log_files(second)[0]
    lines = path.read_bytes().splitlines()
    changed = json.loads(lines[1])
    changed["data"]["cause"] = "someone else"
    path.write_bytes(b"\n".join([lines[0], json.dumps(changed, separators=(",", ":"), sort_keys=True).encode(),
                                 *lines[2:]]) + b"\n")
    done = run("verify", "--file", str(first), "--file", str(second), "--key", str(key))
    assert done.exit_code == 1, done.output
    assert "chain audit-corral-controller-0: OK: 4 records in 1 file(s), seq 1-4 (no checkpoint given" in done.output
    assert ("chain audit-corral-controller-1: BROKEN: audit-000001.jsonl, line 2 (seq 2): its signature does not "
            "match its content") in done.output
    assert "1 of 2 chains broken: audit-corral-controller-1" in done.output


def test_checkpoints_pair_with_chains_in_order_so_a_cut_chain_shows(tmp_path: Path) -> None:
    first, second, key, one, two = two_chains(tmp_path)
    cp0, cp1 = checkpoint_of(tmp_path, "cp-0", one), checkpoint_of(tmp_path, "cp-1", two)
    path = log_files(first)[0]
    path.write_bytes(b"\n".join(path.read_bytes().splitlines()[:2]) + b"\n")  # replica 0's tail cut off
    done = run("verify", "--file", str(first), "--file", str(second), "--key", str(key), "--checkpoint", str(cp0),
               "--checkpoint", str(cp1))
    assert done.exit_code == 1
    assert ("chain audit-corral-controller-0: BROKEN: audit-000001.jsonl, line 3 (seq 3): the log ends at seq 2 but "
            "checkpoint 1 covers seq 4: records were cut off") in done.output, done.output
    assert "chain audit-corral-controller-1: OK" in done.output
    wrong = run("verify", "--file", str(first), "--file", str(second), "--key", str(key), "--checkpoint", str(cp0))
    assert wrong.exit_code == 2 and "1 checkpoint(s) for 2 chain(s): give one per chain" in wrong.output
    twice = run("verify", "--file", str(first), "--file", str(first), "--key", str(key))
    assert twice.exit_code == 2 and "the same chain is given twice" in twice.output


def test_show_merges_the_chains_by_time_and_labels_each_record(tmp_path: Path) -> None:
    first, second, _, _, _ = two_chains(tmp_path)
    done = run("show", "--file", str(first), "--file", str(second), "-o", "json")
    assert done.exit_code == 0, done.output
    records = [json.loads(line) for line in done.output.splitlines()]
    assert [(r["chain"][-1], r["seq"]) for r in records] == [("0", 1), ("1", 1), ("0", 2), ("0", 3), ("0", 4),
                                                             ("1", 2), ("1", 3), ("1", 4)]
    assert [r["at"] for r in records] == sorted(r["at"] for r in records)
    text = run("show", "--file", str(first), "--file", str(second))
    assert text.output.splitlines()[1].startswith("audit-corral-controller-1       1 2026-12-01T12:00:05Z intent.decided")


def test_show_intent_follows_one_intent_across_chains_as_one_story(tmp_path: Path) -> None:
    first, second, _, _, _ = two_chains(tmp_path)
    done = run("show", "--file", str(first), "--file", str(second), "--intent", "warm-up", "-o", "json")
    assert done.exit_code == 0, done.output
    story = [(r["chain"], r["kind"], r["subject"]) for r in map(json.loads, done.output.splitlines())]
    assert story == [
        ("audit-corral-controller-0", "intent.executing", "home/warm-up"),
        ("audit-corral-controller-0", "command.sent", "home/thermostat"),
        ("audit-corral-controller-1", "command.sent", "home/thermostat"),
        ("audit-corral-controller-1", "ack.received", "home/thermostat"),
        ("audit-corral-controller-1", "intent.decided", "home/warm-up"),
    ], story
    # The lamp's command and the other Intents are not part of it; --device still selects by subject.
    lamp = run("show", "--file", str(first), "--file", str(second), "--device", "lamp", "-o", "json")
    assert [json.loads(line)["data"]["commandId"] for line in lamp.output.splitlines()] == ["c-lamp"]


def test_one_chain_reads_as_before_without_labels(tmp_path: Path) -> None:
    first, _, key, _, _ = two_chains(tmp_path)
    done = run("verify", "--file", str(first), "--key", str(key))
    assert done.exit_code == 0 and done.output.startswith("OK: 4 records in 1 file(s), seq 1-4 (no checkpoint"), \
        done.output
    shown = run("show", "--file", str(first), "-o", "json")
    assert ["chain" not in json.loads(line) for line in shown.output.splitlines()] == [True] * 4
    none = run("show")
    assert none.exit_code == 2 and "give --file DIR" in none.output


def test_a_citation_is_borne_out_by_whichever_chain_holds_its_record() -> None:
    from corral.audit.citations import Citation, RetainedLog, check_chains

    zero, one = RetainedLog(1, ["a" * 64, "b" * 64]), RetainedLog(3, ["c" * 64, "d" * 64])
    checked = check_chains([Citation("home/x", 2, "b" * 64), Citation("home/y", 4, "d" * 64),
                            Citation("home/old", 1, "e" * 64), Citation("home/cut", 7, "f" * 64)], [zero, one])
    assert (checked.found, checked.older) == (2, 1), checked
    assert checked.problems == ("Intent home/cut cites its decision at seq 7 (hash ffffffffffff...), but no chain "
                                "holds that record (the chains end at seq 2, 4): records the cluster has seen were "
                                "cut off, or a log was rewritten",)
