"""client-go's Lease algorithm as ported (scale/election.py), on an in-memory Lease store with injected clocks:
the fence's arithmetic, when another's Lease may be taken, epochs, release, and MicroTime on the wire.

The store answers as the API server does for GET/POST/PUT on one Lease (404, 409 on a stale resourceVersion or an
existing name); the real server is in tests/integration/test_shard_leases.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral.kube.client import ApiError
from corral.scale.election import (
    LeaseElector,
    LeaseRecord,
    epoch_ms,
    format_microtime,
    parse_microtime,
    prefix_label,
)


class Store:
    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.requests: list[str] = []
        self.hook: Callable[[str], None] | None = None  # runs as each request arrives


    async def request(self, method: str, path: str, *, params: Any = None, body: Any = None,
                      content_type: str = "") -> dict[str, Any]:
        self.requests.append(method)
        if self.hook is not None:
            self.hook(method)
        if method == "GET":
            if self.lease is None:
                raise ApiError(404, "not found")
            return copy.deepcopy(self.lease)
        if method == "POST":
            if self.lease is not None:
                raise ApiError(409, "already exists")
            return self._write(body)
        if method == "PUT":
            if self.lease is None:
                raise ApiError(404, "not found")
            if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
                raise ApiError(409, "the object has been modified")
            return self._write(body)
        raise AssertionError(method)

    def _write(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)

    def record(self) -> LeaseRecord:
        assert self.lease is not None
        return LeaseRecord.model_validate(self.lease["spec"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


WALL = datetime(2026, 12, 3, 0, 0, tzinfo=UTC)


def elector(store: Store, identity: str, clock: Clock, wall: datetime = WALL) -> LeaseElector:
    # The elector calls only request(), which the store answers as the API server would.
    return LeaseElector(store, "ns", "corral-controller-shard-0", identity,
                        lease_duration_s=15, renew_deadline_s=10, labels={"corral.dev/lease-prefix": "corral"},
                        clock=clock, wall=lambda: wall + timedelta(seconds=clock.now - 1000.0))


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_the_first_creates_the_lease_and_holds_it_until_its_renew_deadline() -> None:
    store, clock = Store(), Clock()
    a = elector(store, "pod-0_aaaa", clock)
    assert run(a.try_acquire_or_renew())
    assert store.requests == ["GET", "POST"]
    record = store.record()
    assert (record.holder, record.lease_duration_s, record.transitions) == ("pod-0_aaaa", 15, 0)
    assert store.lease is not None and store.lease["metadata"]["labels"] == {"corral.dev/lease-prefix": "corral"}
    assert a.valid_until == 1010.0 and a.epoch == epoch_ms(WALL)
    clock.now = 1009.999
    assert a.valid()
    clock.now = 1010.0
    assert not a.valid(), "the fence closes at the renew deadline, whatever the loop thinks"


def test_the_deadline_counts_from_before_the_renewal_was_sent() -> None:
    store, clock = Store(), Clock()
    a = elector(store, "pod-0_aaaa", clock)
    run(a.try_acquire_or_renew())

    def taking_three_seconds(method: str) -> None:
        clock.now += 3.0  # the answer arrives 3 s after the request left

    store.hook = taking_three_seconds
    clock.now = 1005.0
    assert run(a.try_acquire_or_renew())
    assert clock.now == 1008.0
    assert a.valid_until == 1015.0, "valid_until must be the send time plus the renew deadline, not the answer's"


def test_a_renewal_is_one_optimistic_put_keeping_acquire_time_and_transitions() -> None:
    store, clock = Store(), Clock()
    a = elector(store, "pod-0_aaaa", clock)
    run(a.try_acquire_or_renew())
    store.requests.clear()
    clock.now = 1002.0
    assert run(a.try_acquire_or_renew(read=False))
    assert store.requests == ["PUT"]
    record = store.record()
    assert record.acquire_time == WALL and record.renew_time == WALL + timedelta(seconds=2)
    assert record.transitions == 0 and a.epoch == epoch_ms(WALL)


def test_another_holder_is_taken_over_only_after_its_record_stood_still_for_the_lease_duration() -> None:
    store, clock = Store(), Clock()
    a, b = elector(store, "pod-0_aaaa", clock), elector(store, "pod-1_bbbb", clock)
    run(a.try_acquire_or_renew())
    clock.now = 1001.0
    assert not run(b.try_acquire_or_renew())  # b first sees a's record at 1001
    clock.now = 1002.0
    assert run(a.try_acquire_or_renew())  # a renews: the record changes
    clock.now = 1003.0
    assert not run(b.try_acquire_or_renew())  # b sees the change at 1003: a's for 15 s from then
    # a freezes (no more renewals). Its fence closed at 1012; b may take at 1018, not before.
    clock.now = 1012.0
    assert not a.valid()
    clock.now = 1017.99
    assert not run(b.try_acquire_or_renew())
    clock.now = 1018.0
    assert run(b.try_acquire_or_renew())
    record = store.record()
    assert record.holder == "pod-1_bbbb" and record.transitions == 1
    assert b.epoch is not None and a.epoch is not None and b.epoch > a.epoch


def test_a_lost_race_is_not_an_error() -> None:
    store, clock = Store(), Clock()
    a, b, c = (elector(store, name, clock) for name in ("pod-0_aaaa", "pod-1_bbbb", "pod-2_cccc"))
    run(a.try_acquire_or_renew())
    run(a.release())
    b.observe(copy.deepcopy(store.lease))  # b lists the released Lease...
    clock.now = 1001.0
    assert run(c.try_acquire_or_renew())  # ...c takes it first...
    before = store.record()
    assert run(b.try_acquire_or_renew(read=False)) is False  # ...and b's write on what it saw is refused (409)
    assert store.requests[-1] == "PUT"
    assert store.record() == before and not b.valid()


def test_the_epoch_grows_even_when_the_new_holders_wall_clock_is_behind() -> None:
    store, clock = Store(), Clock()
    a = elector(store, "pod-0_aaaa", clock)
    run(a.try_acquire_or_renew())
    run(a.release())
    late = elector(store, "pod-1_bbbb", clock, wall=WALL - timedelta(minutes=5))
    assert run(late.try_acquire_or_renew())
    assert late.epoch is not None and a.epoch is None
    assert late.epoch > epoch_ms(WALL)


def test_release_stops_acting_first_then_frees_the_lease_for_one_second() -> None:
    store, clock = Store(), Clock()
    a = elector(store, "pod-0_aaaa", clock)
    run(a.try_acquire_or_renew())
    seen_valid: list[bool] = []
    store.hook = lambda method: seen_valid.append(a.valid())
    assert run(a.release())
    assert seen_valid and not any(seen_valid), "the holder still counted itself valid while releasing"
    record = store.record()
    assert record.holder == "" and record.lease_duration_s == 1 and record.transitions == 0
    assert not run(a.try_acquire_or_renew(acquire=False)), "a renewal took back a released Lease"
    assert store.record().holder == ""
    b = elector(store, "pod-1_bbbb", clock)
    assert run(b.try_acquire_or_renew()), "a released Lease is free at once"
    assert store.record().transitions == 1


def test_a_lease_naming_this_process_after_its_deadline_is_taken_back_as_new() -> None:
    store, clock = Store(), Clock()
    a = elector(store, "pod-0_aaaa", clock)
    run(a.try_acquire_or_renew())
    first = a.epoch
    clock.now = 1011.0
    a.drop()  # its deadline passed (ShardOwnership calls `lost` and drops it)
    assert run(a.try_acquire_or_renew())
    assert first is not None and a.epoch is not None and a.epoch > first
    assert store.record().transitions == 1


def test_microtime_is_read_and_written_as_the_api_server_does() -> None:
    moment = parse_microtime("2026-12-03T00:26:22.123456Z")
    assert moment == datetime(2026, 12, 3, 0, 26, 22, 123456, tzinfo=UTC)
    assert format_microtime(moment) == "2026-12-03T00:26:22.123456Z"
    assert format_microtime(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000000Z"
    assert parse_microtime("2026-12-03T01:26:22+01:00") == datetime(2026, 12, 3, 0, 26, 22, tzinfo=UTC)
    assert epoch_ms(moment) == 1_796_257_582_123


@pytest.mark.parametrize("wrong", ["yesterday", "2026-12-03T00:26:22"])
def test_a_wrong_microtime_says_what_is_expected(wrong: str) -> None:
    with pytest.raises(ValueError, match="MicroTime"):
        parse_microtime(wrong)


def test_a_naive_datetime_is_refused_on_the_wire() -> None:
    with pytest.raises(ValueError, match="aware"):
        format_microtime(datetime(2026, 1, 1))


def test_a_lease_spec_with_nulls_reads_as_nobody_holding() -> None:
    record = LeaseRecord.model_validate({"holderIdentity": None, "leaseDurationSeconds": 1})
    assert record.holder == "" and record.acquire_time is None and record.transitions == 0


def test_the_prefix_label_is_the_prefix_or_a_digest_when_it_cannot_be_a_label_value() -> None:
    assert prefix_label("corral-controller") == "corral-controller"
    long = "a-release-name-that-is-rather-long-for-a-label-value-in-kubernetes-controller"
    value = prefix_label(long)
    assert value.startswith("sha256-") and len(value) <= 63 and value == prefix_label(long)
    assert prefix_label("ends-with-dash-") != "ends-with-dash-"


def test_a_lease_deleted_under_its_holder_is_created_again_by_the_renewal() -> None:
    store, clock = Store(), Clock()
    a = elector(store, "pod-0_aaaa", clock)
    run(a.try_acquire_or_renew())
    store.lease = None  # someone deleted it
    store.requests.clear()
    clock.now = 1002.0
    assert run(a.try_acquire_or_renew(read=False))
    assert store.requests == ["PUT", "GET", "POST"]
    assert store.record().holder == "pod-0_aaaa" and a.valid_until == 1012.0
