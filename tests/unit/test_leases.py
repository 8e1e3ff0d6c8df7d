"""Leases, judged: who may act on a leased Device, what acquire, release and break decide, and the Lease object."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from corral.api.lease import BROKEN_AT, BROKEN_BY, BROKEN_REASON, HOLDER, HOLDER_ID, REASON
from corral.api.pause import Paused
from corral.decide.decision import Broken, DeviceFacts, Guards, Lease, Policy, decide
from corral.decide.leases import parse
from tests.unit.test_decide import DEVICE, HASH, approval, intent

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
A, B = "system:serviceaccount:home:agent-a", "system:serviceaccount:home:agent-b"
HELD = Lease(A, NOW + timedelta(minutes=3), "cleaning the bedroom", "session-1")


def run(requester: str, holder_id: str | None, guards: Guards, action: str = "set_state", value: object = True,
        may: bool = True) -> tuple[str | None, str]:
    actuator = "lease" if action in ("acquire", "release", "break") else "light"
    facts = intent(requester=requester, holder_id=holder_id, action=action, actuator=actuator, value=value,
                   created_at=NOW - timedelta(seconds=1))
    decision = decide(facts, DEVICE, may, [approval()], HASH, NOW, Policy(), guards)
    return (decision.code if decision.outcome == "final" else decision.outcome), decision.message


def test_while_a_device_is_leased_only_its_holder_acts_and_others_are_told_who_why_and_until_when() -> None:
    assert run(A, "session-1", Guards(lease=HELD))[0] == "execute"
    code, message = run(B, None, Guards(lease=HELD))
    assert code == "DENY_LEASED"
    assert A in message and "session-1" in message and "cleaning the bedroom" in message and "12:03:00" in message
    # Two loops under one identity do not share it: another holder id is someone else.
    assert run(A, "session-2", Guards(lease=HELD))[0] == "DENY_LEASED"
    # An expired lease holds nothing.
    assert run(B, None, Guards(lease=replace(HELD, expires_at=NOW)))[0] == "execute"


def test_acquire_takes_a_free_or_own_lease_with_a_bounded_ttl_and_is_refused_when_another_holds_it() -> None:
    assert run(A, "s", Guards(), "acquire", None)[0] == "execute"
    assert run(A, "session-1", Guards(lease=HELD), "acquire", 60)[0] == "execute"  # renewing one's own
    assert run(B, None, Guards(lease=HELD), "acquire", 60)[0] == "DENY_LEASED"
    code, message = run(A, "s", Guards(), "acquire", 7200)
    assert code == "DENY_ARGUMENTS" and "1 to 3600 whole seconds" in message
    assert run(A, "s", Guards(), "acquire", 60, may=False) == (
        "DENY_SCOPE", f"{A} may not take exclusive control of device front-lock: it needs the 'write' verb on "
                      "devices/front-lock (corral.dev).")
    chosen = decide(intent(requester=A, action="acquire", actuator="lease", value=None), DEVICE, True, [], HASH, NOW)
    assert chosen.value == 300  # the policy's default idle TTL


def test_release_is_the_holders_and_break_needs_approve_and_a_lease() -> None:
    assert run(A, "session-1", Guards(lease=HELD), "release", None)[0] == "execute"
    assert run(B, None, Guards(lease=HELD), "release", None)[0] == "DENY_LEASED"
    assert run(A, None, Guards(), "release", None) == ("EXECUTED", "Device front-lock has no lease of yours; "
                                                                    "nothing to release.")
    assert run("alice", None, Guards(lease=HELD), "break", None)[0] == "execute"
    assert run("alice", None, Guards(lease=HELD), "break", None, may=False)[0] == "DENY_SCOPE"
    assert run("alice", None, Guards(), "break", None)[0] == "EXECUTED"


def test_the_holder_of_a_broken_lease_is_told_by_whom_and_why_until_it_would_have_expired() -> None:
    broken = Broken(A, "session-1", "alice", "the dog is in there", NOW - timedelta(seconds=5), NOW + timedelta(minutes=2))
    code, message = run(A, "session-1", Guards(broken=broken))
    assert code == "DENY_LEASED" and "broken by alice" in message and "the dog is in there" in message
    assert run(B, None, Guards(broken=broken))[0] == "execute"  # the device is free for everyone else
    assert run(A, "session-1", Guards(broken=replace(broken, until=NOW)))[0] == "execute"
    assert run(A, "session-1", Guards(broken=broken), "acquire", 60)[0] == "execute"  # may ask again


def test_a_lease_object_reads_back_as_the_lease_it_holds_or_the_one_a_person_broke() -> None:
    body = {"metadata": {"annotations": {HOLDER: A, HOLDER_ID: "session-1", REASON: "cleaning"}},
            "spec": {"holderIdentity": f"{A}/session-1", "leaseDurationSeconds": 300,
                     "acquireTime": "2026-11-30T11:50:00.000000Z", "renewTime": "2026-11-30T11:58:00.500000Z"}}
    assert parse(body) == (Lease(A, datetime(2026, 11, 30, 12, 3, 0, 500000, tzinfo=UTC), "cleaning", "session-1"),
                           None)
    body["metadata"]["annotations"].update({BROKEN_BY: "alice", BROKEN_REASON: "taking over",
                                            BROKEN_AT: "2026-11-30T11:59:00.000000Z"})
    body["spec"]["holderIdentity"] = None
    lease, broken = parse(body)
    assert lease is None and broken is not None and (broken.holder, broken.by, broken.reason) == (A, "alice",
                                                                                                  "taking over")
    assert parse({"metadata": {}, "spec": {}}) == (None, None)


def test_reads_are_not_held_by_a_lease() -> None:
    facts = intent(requester=B, action="read", actuator="light", value=None)
    assert decide(facts, DeviceFacts(True, "front-lock", DEVICE.contract, True), True, [], HASH, NOW,
                  guards=Guards(lease=HELD)).outcome == "execute"


def test_a_paused_agent_cannot_take_a_lease_but_may_give_its_own_back() -> None:
    paused = Paused(namespace="home", by="alice", reason="dinner", since=NOW)
    assert run(A, "session-1", Guards(paused=paused), "acquire", 60)[0] == "DENY_PAUSED"
    assert run(A, "session-1", Guards(paused=paused, lease=HELD), "release", None)[0] == "execute"
