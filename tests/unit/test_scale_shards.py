"""ShardOwnership's promises (scale/shards.py) on an in-memory Lease store: owns() is the deadline itself, a crashed
loop owns nothing, `lost` comes once at the deadline, `acquired` does not hold up the loop, `releasing` comes before
a Lease is given back, and stop() gives back everything held and the member Lease.

The real API server is in tests/integration/test_shard_leases.py; here the clock is injected where it matters.
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from corral.kube.client import ApiError
from corral.scale.election import LeaseRecord
from corral.scale.hashing import shard_of
from corral.scale.settings import ScaleSettings
from corral.scale.shards import ShardOwnership

PATH = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases(?:/(?P<name>[^/]+))?$")


class Store:
    """GET/LIST/POST/PUT of Leases as the API server answers them (404, 409 on a stale resourceVersion)."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.failing = False

    async def request(self, method: str, path: str, *, params: Any = None, body: Any = None,
                      content_type: str = "") -> dict[str, Any]:
        if self.failing:
            raise ApiError(500, "the API server is unwell")
        found = PATH.match(path)
        assert found, path
        name = found["name"]
        if method == "GET" and name is None:
            key, _, value = (params or {})["labelSelector"].partition("=")
            return {"items": [copy.deepcopy(lease) for lease in self.leases.values()
                              if lease["metadata"].get("labels", {}).get(key) == value]}
        if method == "GET":
            if name not in self.leases:
                raise ApiError(404, "not found")
            return copy.deepcopy(self.leases[name])
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.leases:
                raise ApiError(409, "already exists")
            return self._write(name, body)
        if method == "PUT":
            if name not in self.leases:
                raise ApiError(404, "not found")
            if body["metadata"].get("resourceVersion") != self.leases[name]["metadata"]["resourceVersion"]:
                raise ApiError(409, "the object has been modified")
            return self._write(name, body)
        raise AssertionError(method)

    def _write(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.leases[name] = copy.deepcopy(body)
        self.leases[name]["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.leases[name])

    def holder(self, name: str) -> str:
        return LeaseRecord.model_validate(self.leases[name]["spec"]).holder


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def settings(shards: int = 2, lease: float = 15, renew: float = 10, retry: float = 0.05) -> ScaleSettings:
    return ScaleSettings(identity="corral-0_0123abcd", namespace="ns", lease_prefix="corral", shards=shards,
                         lease_duration_s=lease, renew_deadline_s=renew, retry_period_s=retry, enabled=True)


def device_in(shard: int, shards: int) -> str:
    return next(f"d{n}" for n in range(1000) if shard_of(f"d{n}", shards) == shard)


Callback = Callable[[int], Awaitable[None]]


def recorder(calls: list[tuple[str, int]], what: str) -> Callback:
    async def called(shard: int) -> None:
        calls.append((what, shard))
    return called


async def until(probe: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_owns_is_the_renew_deadline_itself_not_a_flag_the_loop_clears() -> None:
    async def main() -> None:
        store, clock = Store(), Clock()
        own = ShardOwnership(settings(), store, clock=clock)  # the store answers request() as the API would
        await own.start()
        zero, one = device_in(0, 2), device_in(1, 2)
        assert own.owns(zero) and own.owns(one) and own.is_leader() and own.owned() == frozenset({0, 1})
        assert own.epoch(zero) is not None and own.deadline(0) == 510.0
        await own.abandon()  # nothing runs any more: no loop, no timer
        clock.now = 509.999
        assert own.owns(zero)
        clock.now = 510.0
        assert not own.owns(zero) and not own.owns(one) and not own.is_leader()
        assert own.epoch(zero) is None and own.owned() == frozenset() and own.deadline(0) is None

    asyncio.run(main())


def test_a_crashed_loop_owns_nothing_at_once_and_calls_lost_once_per_shard() -> None:
    async def main() -> None:
        store, clock = Store(), Clock()
        calls: list[tuple[str, int]] = []
        own = ShardOwnership(settings(), store, clock=clock)
        own.set_callbacks(recorder(calls, "acquired"), recorder(calls, "releasing"), recorder(calls, "lost"))
        await own.start()
        assert own.owned() == frozenset({0, 1})
        # A Lease the API server would never return: the next round's reading of it fails, a bug's stand-in.
        store.leases["corral-member-corral-9"] = {
            "metadata": {"name": "corral-member-corral-9", "labels": {"corral.dev/lease-prefix": "corral"},
                         "resourceVersion": "1"},
            "spec": {"holderIdentity": "corral-9_ffffffff", "leaseTransitions": -1}}
        await until(lambda: sum(1 for what, _ in calls if what == "lost") == 2, "lost for both shards")
        assert own.owned() == frozenset() and not own.owns(device_in(1, 2)), "owns() after a crash"
        assert clock.now < 510.0  # well within the deadline: it is the crash that closed the fence
        await asyncio.sleep(0.2)
        assert sorted(calls) == [("acquired", 0), ("acquired", 1), ("lost", 0), ("lost", 1)]

    asyncio.run(main())


def test_lost_comes_once_at_the_deadline_when_renewals_fail() -> None:
    async def main() -> None:
        store = Store()
        calls: list[tuple[str, int]] = []
        own = ShardOwnership(settings(shards=1, lease=0.6, renew=0.4, retry=0.05), store)
        own.set_callbacks(recorder(calls, "acquired"), recorder(calls, "releasing"), recorder(calls, "lost"))
        await own.start()
        deadline = own.deadline(0)
        assert deadline is not None
        store.failing = True
        await until(lambda: ("lost", 0) in calls, "lost")
        assert time.monotonic() >= deadline - 0.4 + 0.3, "lost before the deadline of the last renewal"
        assert not own.owns("anything")
        await asyncio.sleep(0.3)
        assert calls.count(("lost", 0)) == 1
        store.failing = False
        await until(lambda: calls.count(("acquired", 0)) == 2, "the shard taken back once the API server answers")
        assert own.owns("anything")
        await own.stop()

    asyncio.run(main())


def test_acquired_runs_beside_the_loop_and_owns_is_true_from_acquisition() -> None:
    async def main() -> None:
        store = Store()
        gate = asyncio.Event()
        owned_during: list[bool] = []
        own = ShardOwnership(settings(shards=1), store)

        async def acquired(shard: int) -> None:
            owned_during.append(own.owns("x"))
            await gate.wait()  # a slow start of the shard's work

        async def nothing(shard: int) -> None:
            return None

        own.set_callbacks(acquired, nothing, nothing)
        await asyncio.wait_for(own.start(), 2)
        await until(lambda: bool(owned_during), "acquired to be called")
        assert owned_during == [True] and own.owns("x")
        gate.set()
        await own.stop()

    asyncio.run(main())


def test_stop_awaits_releasing_while_still_owning_then_gives_back_every_lease() -> None:
    async def main() -> None:
        store = Store()
        seen: list[tuple[int, bool, str]] = []
        own = ShardOwnership(settings(shards=3), store)

        async def releasing(shard: int) -> None:
            await asyncio.sleep(0.05)
            seen.append((shard, own.owns(device_in(shard, 3)), store.holder(f"corral-shard-{shard}")))

        async def nothing(shard: int) -> None:
            return None

        own.set_callbacks(nothing, releasing, nothing)
        await own.start()
        assert store.holder("corral-member-corral-0") == own.identity
        await own.stop()
        assert sorted(seen) == [(k, True, own.identity) for k in range(3)], "releasing came after the release"
        assert own.owned() == frozenset()
        for name in ("corral-shard-0", "corral-shard-1", "corral-shard-2", "corral-member-corral-0"):
            assert store.holder(name) == "", f"{name} still held after stop()"
        assert set(store.leases) == {"corral-shard-0", "corral-shard-1", "corral-shard-2",
                                     "corral-member-corral-0"}, "stop() deletes nothing"

    asyncio.run(main())


def test_a_releasing_callback_that_hangs_does_not_keep_the_shard() -> None:
    async def main() -> None:
        store = Store()
        own = ShardOwnership(settings(shards=1, lease=0.6, renew=0.3, retry=0.05), store)

        async def hangs(shard: int) -> None:
            await asyncio.Event().wait()

        async def nothing(shard: int) -> None:
            return None

        own.set_callbacks(nothing, hangs, nothing)
        await own.start()
        began = time.monotonic()
        await own.stop()
        assert 0.25 <= time.monotonic() - began < 2.0
        assert store.holder("corral-shard-0") == ""

    asyncio.run(main())


def test_a_member_counts_others_as_live_only_while_their_lease_moves() -> None:
    async def main() -> None:
        store, clock = Store(), Clock()
        a = ShardOwnership(settings(shards=4), store, clock=clock)
        other = settings(shards=4)
        b = ShardOwnership(ScaleSettings(**{**other.__dict__, "identity": "corral-1_89abcdef"}), store, clock=clock)
        await a.start()
        assert a.owned() == frozenset(range(4)) and a.live_members == 1
        await b.start()
        await until(lambda: a.live_members == 2 and len(a.owned()) == 2 and len(b.owned()) == 2, "two each")
        assert a.owned() & b.owned() == frozenset()
        await b.abandon()  # b's Leases stop moving...
        await asyncio.sleep(0.3)  # ...a sees them as b left them...
        clock.now += 15.5  # ...and they stand still past their lease duration on a's clock
        await until(lambda: a.live_members == 1, "b no longer counted")
        await until(lambda: a.owned() == frozenset(range(4)), "a to take b's expired shards")
        await a.stop()

    asyncio.run(main())


def test_a_slow_releasing_does_not_stop_the_renewals_and_the_shard_moves_only_after_it() -> None:
    async def main() -> None:
        store = Store()
        fast = dict(shards=2, lease=1.5, renew=1.0, retry=0.05)
        a = ShardOwnership(settings(**fast), store)
        b = ShardOwnership(ScaleSettings(**{**settings(**fast).__dict__, "identity": "corral-1_89abcdef"}), store)
        deadlines: list[float] = []

        async def releasing(shard: int) -> None:
            for _ in range(16):  # 0.8 s of in-flight work ending, within the renew deadline
                await asyncio.sleep(0.05)
                deadline = a.deadline(0)
                assert deadline is not None
                deadlines.append(deadline)
                assert a.owns(device_in(shard, 2)) and not b.owns(device_in(shard, 2))

        async def nothing(shard: int) -> None:
            return None

        a.set_callbacks(nothing, releasing, nothing)
        await a.start()
        assert a.owned() == frozenset({0, 1})
        await b.start()
        await until(lambda: b.owned() == frozenset({1}), "shard 1 to move to b")
        assert a.owned() == frozenset({0})
        assert len(deadlines) == 16 and deadlines[-1] - deadlines[0] > 0.5, "shard 0 was not renewed meanwhile"
        await asyncio.gather(a.stop(), b.stop())

    asyncio.run(main())


def test_a_held_lease_deleted_under_its_holder_is_lost_at_once_then_taken_anew() -> None:
    async def main() -> None:
        store, clock = Store(), Clock()
        calls: list[tuple[str, int]] = []
        own = ShardOwnership(settings(shards=1), store, clock=clock)
        own.set_callbacks(recorder(calls, "acquired"), recorder(calls, "releasing"), recorder(calls, "lost"))
        await own.start()
        first = own.epoch("x")
        del store.leases["corral-shard-0"]  # anyone may create it now: the fence cannot wait for the deadline
        await until(lambda: ("lost", 0) in calls, "lost")
        await until(lambda: calls.count(("acquired", 0)) == 2, "the shard taken anew")
        assert own.owns("x") and own.epoch("x") != first
        await own.stop()

    asyncio.run(main())
