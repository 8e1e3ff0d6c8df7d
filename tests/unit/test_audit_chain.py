"""The audit log's chain and checkpoints (audit.chain, audit.checkpoint): every tampering is caught and named."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.chain import GENESIS, AuditRecord, Chain, canonical, digest, verify_lines
from corral.audit.checkpoint import sign_checkpoint, verify_log
from corral.audit.decisions import DecisionIndex

KEY = Ed25519PrivateKey.generate()
TRUSTED = {"controller-1": KEY.public_key()}
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def log(count: int = 6) -> tuple[list[bytes], Chain]:
    chain = Chain()
    lines = [chain.next("intent.decided", f"home/req-{i}", T0 + timedelta(seconds=i),
                        {"code": "EXECUTED", "params": {"value": i % 2 == 0}, "note": "Lüftung ✓"},
                        "controller-1", KEY, uid=f"uid-{i}") for i in range(1, count + 1)]
    return lines, chain


def test_an_untouched_log_verifies() -> None:
    lines, chain = log()
    verified = verify_lines(lines, TRUSTED)
    assert verified.ok and verified.records == 6 and verified.last == chain


def _edited(line: bytes, **changes: object) -> bytes:
    return canonical({**json.loads(line), **changes})


@pytest.mark.parametrize(("tamper", "line", "why"), [
    (lambda ls: [*ls[:2], _edited(ls[2], data={"code": "DENY_SCOPE"}), *ls[3:]], 3, "signature does not match"),
    (lambda ls: [*ls[:2], *ls[3:]], 3, "seq 4 where 3 was due"),
    (lambda ls: [*ls[:2], ls[3], ls[2], *ls[4:]], 3, "seq 4 where 3 was due"),
    (lambda ls: [*ls[:5], ls[4]], 6, "seq 5 where 6 was due: records are out of order or repeated"),
    (lambda ls: [*ls, b"not json"], 7, "not an audit record"),
])
def test_tampering_is_named_where_it_is(tamper: Callable[[list[bytes]], list[bytes]], line: int, why: str) -> None:
    lines, _ = log()
    verified = verify_lines(tamper(lines), TRUSTED)
    assert not verified.ok and verified.broken is not None
    assert verified.broken.line == line and why in str(verified.broken), verified.broken


def test_a_forged_record_fails_even_with_the_right_links() -> None:
    lines, chain = log()
    forger = Ed25519PrivateKey.generate()
    forged = chain.next("intent.decided", "home/req-99", T0, {"code": "EXECUTED"}, "controller-1", forger)
    verified = verify_lines([*lines, forged], TRUSTED)
    assert verified.broken is not None and verified.broken.line == 7
    assert "signature does not match its content" in verified.broken.why


def test_a_record_rewritten_in_another_json_spelling_is_caught() -> None:
    lines, _ = log()
    spaced = json.dumps(json.loads(lines[1]), indent=1).replace("\n", " ").encode()
    verified = verify_lines([lines[0], spaced, *lines[2:]], TRUSTED)
    assert verified.broken is not None and verified.broken.line == 2


def test_a_cut_tail_is_caught_only_by_the_checkpoint() -> None:
    lines, chain = log()
    checkpoint = sign_checkpoint(chain, 1, T0 + timedelta(seconds=7), None, "controller-1", KEY)
    assert verify_lines(lines[:4], TRUSTED).ok, "a chain cannot tell that its tail is gone"
    now = T0 + timedelta(seconds=8)
    assert verify_log(lines, TRUSTED, checkpoint, now, 60).ok
    cut = verify_log(lines[:4], TRUSTED, checkpoint, now, 60)
    assert cut.broken is not None and "ends at seq 4 but checkpoint 1 covers seq 6" in cut.broken.why


def test_an_older_genuine_checkpoint_over_a_cut_log_is_caught_by_its_age() -> None:
    lines, chain = log()
    at_four = Chain(4, digest(lines[3]))
    older = sign_checkpoint(at_four, 1, T0 + timedelta(seconds=5), None, "controller-1", KEY)
    sign_checkpoint(chain, 2, T0 + timedelta(seconds=35), older, "controller-1", KEY)  # the one hidden
    verdict = verify_log(lines[:4], TRUSTED, older, T0 + timedelta(seconds=70), max_age_s=60)
    assert verdict.broken is not None and "65 s old and not final" in verdict.broken.why


def test_nothing_may_follow_a_final_checkpoint() -> None:
    lines, _ = log()
    at_five = Chain(5, digest(lines[4]))
    final = sign_checkpoint(at_five, 3, T0 + timedelta(seconds=6), None, "controller-1", KEY, final=True)
    verdict = verify_log(lines, TRUSTED, final, T0 + timedelta(days=3), 60)
    assert verdict.broken is not None and verdict.broken.line == 6 and "after the controller stopped" in verdict.broken.why
    assert verify_log(lines[:5], TRUSTED, final, T0 + timedelta(days=3), 60).ok, "a final checkpoint does not age"


def test_a_forged_or_rewritten_checkpoint_is_refused() -> None:
    lines, chain = log()
    genuine = sign_checkpoint(chain, 1, T0, None, "controller-1", KEY)
    moved = genuine.model_copy(update={"seq": 4})
    verdict = verify_log(lines, TRUSTED, moved, T0, 60)
    assert verdict.broken is not None and "signature does not match" in verdict.broken.why
    elsewhere = sign_checkpoint(Chain(6, "f" * 64), 1, T0, None, "controller-1", KEY)
    verdict = verify_log(lines, TRUSTED, elsewhere, T0, 60)
    assert verdict.broken is not None and "names another record at seq 6" in verdict.broken.why


def test_a_rotated_file_continues_from_where_the_last_one_ended() -> None:
    lines, _ = log(8)
    first = verify_lines(lines[:5], TRUSTED)
    assert first.ok
    assert verify_lines(lines[5:], TRUSTED, start=first.last).ok
    assert not verify_lines(lines[6:], TRUSTED, start=first.last).ok, "a rotated file that lost its first record"


def test_the_decision_index_knows_the_last_word_on_each_intent() -> None:
    def record(seq: int, kind: str, uid: str | None) -> AuditRecord:
        return AuditRecord(seq=seq, at=datetime.now(UTC), kind=kind, subject="home/x", uid=uid, prev=GENESIS,
                           key="k", data={"n": seq})

    index = DecisionIndex()
    index.load([record(1, "intent.executing", "a"), record(2, "command.sent", None), record(3, "intent.executing", "b"),
                record(4, "intent.decided", "a"), record(5, "device.state_changed", "device-uid")])
    assert set(index.decided) == {"a"} and set(index.executing) == {"b"}  # a executed and ended; b is under way
    index.keep_only({"b"})  # a was deleted after its TTL
    assert len(index) == 1
    index.forget("b")
    assert len(index) == 0


def test_a_sealed_line_is_exactly_the_form_the_verifier_insists_on() -> None:
    """The writer builds lines without the model; any drift from the model's own JSON would fail every record."""
    chain = Chain()
    whole_second = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    lines = [chain.next("intent.decided", "home/a", whole_second, {"when": whole_second, "n": (1, 2)}, "controller-1", KEY),
             chain.next("ack.received", "home/b", datetime.now(UTC), {"ok": True, "state": {"x": 1.5}}, "controller-1", KEY,
                        uid="u-1", trace="0" * 32)]
    assert verify_lines(lines, TRUSTED).ok
    with pytest.raises(ValueError, match="timezone-aware"):
        chain.next("intent.decided", "home/c", datetime(2026, 12, 1), {}, "controller-1", KEY)
    with pytest.raises(ValueError, match="not a valid audit record"):
        chain.next("Not A Kind", "home/c", datetime.now(UTC), {}, "controller-1", KEY)
