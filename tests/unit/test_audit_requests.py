"""The idempotency index by Intent name (audit.requests): what a replay of a deleted Intent is compared with."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.audit.chain import GENESIS, AuditRecord
from corral.audit.log import AuditLog, log_files, read_records
from corral.audit.requests import IDENTITY, REPLAY_OF, RequestNames
from corral.audit.signer import Retention
from corral.decide.idempotency import compare, identity_hash
from corral.reconcile.config import ControllerConfig
from corral.reconcile.controller import _audit

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
SPEC = {"device": "kitchen-light", "actuator": "power", "action": "set_state", "params": {"value": True},
        "requester": "system:serviceaccount:home:agent", "reason": "evening"}
SAME = identity_hash({**SPEC, "reason": "rephrased"})  # the reason is not part of the request's identity
OTHER = identity_hash({**SPEC, "params": {"value": False}})


def decided(uid: str, at: datetime, identity: str | None = SAME, code: str = "EXECUTED", name: str = "home/req-1",
            **data: Any) -> AuditRecord:
    body: dict[str, Any] = {"code": code, "message": "m", **data}
    if identity is not None:
        body[IDENTITY] = identity
    return AuditRecord(seq=1, at=at, kind="intent.decided", subject=name, uid=uid, data=body, prev=GENESIS, key="c1")


def test_the_hash_is_the_clients_comparison() -> None:
    """The controller's answer from the log and the client's answer from the object agree."""
    assert identity_hash(SPEC) == SAME and compare(SPEC, {**SPEC, "reason": "x"}) == "DEDUP"
    assert identity_hash({**SPEC, "params": {"value": 1.0}}) == identity_hash({**SPEC, "params": {"value": 1}})
    assert OTHER != SAME and compare(SPEC, {**SPEC, "params": {"value": False}}) == "DENY_ID_CONFLICT"


def test_a_name_is_known_to_other_uids_within_the_window_only() -> None:
    names = RequestNames(timedelta(hours=24))
    names.add(decided("uid-1", T0, before={"power": False}, after={"power": True}))
    found = names.earlier("home/req-1", "uid-2", T0 + timedelta(hours=23, minutes=59))
    assert found is not None and (found.uid, found.identity, found.code, found.decided_at) == (
        "uid-1", SAME, "EXECUTED", T0)
    assert (found.before, found.after) == ({"power": False}, {"power": True})  # what the same request answers
    assert names.earlier("home/req-1", "uid-1", T0 + timedelta(minutes=1)) is None  # its own Intent: no replay
    assert names.earlier("other/req-1", "uid-2", T0 + timedelta(minutes=1)) is None  # names are per namespace
    assert names.earlier("home/req-1", "uid-2", T0 + timedelta(hours=24)) is None  # the window is over


def test_records_without_the_hash_dry_runs_and_other_kinds_are_not_entries() -> None:
    names = RequestNames()
    names.add(decided("old-version", T0, identity=None))
    names.add(decided("dry", T0, name="home/dry", dryRun=True))
    names.add(AuditRecord(seq=2, at=T0, kind="intent.executing", subject="home/exec", uid="u", prev=GENESIS, key="c1",
                          data={IDENTITY: SAME, "code": "EXECUTED"}))
    assert len(names) == 0
    assert names.earlier("home/req-1", "new", T0) is None and names.earlier("home/dry", "new", T0) is None


def test_a_replays_own_answer_does_not_replace_the_original() -> None:
    """DEDUP and DENY_ID_CONFLICT are decisions of their own, but what later replays compare with stays the first."""
    names = RequestNames()
    names.add(decided("uid-1", T0))
    names.add(decided("uid-2", T0 + timedelta(hours=2), identity=OTHER, code="DENY_ID_CONFLICT",
                      **{REPLAY_OF: "uid-1"}))
    names.add(decided("uid-3", T0 + timedelta(hours=3), code="DEDUP", **{REPLAY_OF: "uid-1"}))
    found = names.earlier("home/req-1", "uid-4", T0 + timedelta(hours=4))
    assert found is not None and (found.uid, found.identity, found.code) == ("uid-1", SAME, "EXECUTED")
    # Even a decision on its merits under a used name (one this index did not know of when it was made) leaves the
    # window's first decision in place; once the window is over, the name is new again.
    names.add(decided("uid-5", T0 + timedelta(hours=5), identity=OTHER, code="DENY_SCOPE"))
    found = names.earlier("home/req-1", "uid-6", T0 + timedelta(hours=6))
    assert found is not None and found.uid == "uid-1"
    names.add(decided("uid-7", T0 + timedelta(hours=25), identity=OTHER, code="EXECUTED"))
    found = names.earlier("home/req-1", "uid-8", T0 + timedelta(hours=26))
    assert found is not None and (found.uid, found.identity) == ("uid-7", OTHER)


def test_expired_entries_are_dropped_so_the_index_holds_one_window() -> None:
    names = RequestNames(timedelta(hours=1))
    for i in range(100):
        names.add(decided(f"uid-{i}", T0 + timedelta(minutes=i), name=f"home/req-{i}"))
    assert len(names) == 60  # the entries of the last hour, at the newest record's time
    names.expire(T0 + timedelta(minutes=200))
    assert len(names) == 0


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="longer than 0 s"):
        RequestNames(timedelta(0))


def test_a_restart_reads_the_index_back_from_every_rotated_file(tmp_path: Path) -> None:
    """The controller's start-up load (read_records over all files): what one index learnt as records were
    written, a new one learns again from the files, across rotation."""
    key = Ed25519PrivateKey.generate()
    audit = AuditLog(tmp_path, "c1", key, max_bytes=4096)
    audit.open()
    live = RequestNames()
    audit.on_record(live.add)

    async def write() -> None:
        for i in range(60):
            await audit.append("intent.decided", f"home/req-{i}", {"code": "EXECUTED", IDENTITY: SAME,
                                                                    "padding": "x" * 100}, uid=f"uid-{i}")
        await audit.append("intent.decided", "home/req-0", {"code": "DEDUP", IDENTITY: SAME, REPLAY_OF: "uid-0"},
                           uid="uid-replay")

    asyncio.run(write())
    audit.close()
    assert len(log_files(tmp_path)) > 2, "rotation was forced"
    restarted = RequestNames()
    restarted.load(read_records(tmp_path, datetime.now(UTC) - timedelta(hours=24)))
    now = datetime.now(UTC)
    for names in (live, restarted):
        assert len(names) == 60
        first, last = names.earlier("home/req-0", "new", now), names.earlier("home/req-59", "new", now)
        assert first is not None and (first.uid, first.code) == ("uid-0", "EXECUTED")  # not the replay's DEDUP
        assert last is not None and last.uid == "uid-59"


def test_age_retention_keeps_the_idempotency_window(tmp_path: Path) -> None:
    """Files holding decisions younger than the window are not deleted for their age; the size budget still may."""
    def retention(days: float, window_s: float) -> Retention | None:
        config = ControllerConfig(mqtt_url="mqtt://c@localhost:1883", audit_dir=str(tmp_path / "audit"),
                                  audit_key_file=str(tmp_path / "keys" / "c.pem"),
                                  audit_retention=Retention(days * 86400.0, 2**20), idempotency_window_s=window_s)
        kube: Any = SimpleNamespace(api=None)  # no checkpoint object: the API is never called
        return _audit(config, kube)[1].retention

    assert retention(0.01, 86400.0) == Retention(86400.0, 2**20)
    assert retention(2, 86400.0) == Retention(2 * 86400.0, 2**20)
    assert retention(1, 3 * 86400.0) == Retention(3 * 86400.0, 2**20)
