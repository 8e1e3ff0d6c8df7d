"""Shards held through real Leases on a real API server: one holder at a time, handover on stop, takeover after a
holder dies only once its Lease expired, and a member leaving moves only its own shards.

In-process (several `ShardOwnership`s on one event loop, as several replicas would be), with short timings: lease
3 s, renew deadline 2 s, retry period 0.5 s. Every check samples both sides in the same instant of the loop.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import kubernetes
import pytest

from corral.kube.client import AsyncApi
from corral.scale.settings import ScaleSettings
from corral.scale.shards import ShardOwnership

pytestmark = pytest.mark.integration

LEASE, RENEW, RETRY = 3.0, 2.0, 0.5
SAMPLE = 0.05


def _settings(namespace: str, prefix: str, pod: str, shards: int) -> ScaleSettings:
    return ScaleSettings(identity=f"{pod}_{uuid.uuid4().hex[:8]}", namespace=namespace, lease_prefix=prefix,
                         shards=shards, lease_duration_s=LEASE, renew_deadline_s=RENEW, retry_period_s=RETRY,
                         enabled=True)


def _device_of(shard: int, shards: int) -> str:
    """A device id that falls into `shard`."""
    from corral.scale.hashing import shard_of

    return next(f"dev-{n}" for n in range(10_000) if shard_of(f"dev-{n}", shards) == shard)


async def _until(probe: Callable[[], bool], what: str, timeout_s: float,
                 every: Callable[[], None] | None = None) -> float:
    """Wait for probe() (sampling every 50 ms, running `every` at each sample); the seconds it took."""
    began = time.monotonic()
    while True:
        if every is not None:
            every()
        if probe():
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(SAMPLE)


def _run(kube: kubernetes.client.ApiClient, test: Callable[[AsyncApi], Awaitable[None]]) -> None:
    async def main() -> None:
        api = AsyncApi(kube.configuration, connections=8)
        try:
            await test(api)
        finally:
            await api.close()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_one_shard_one_holder_and_a_stop_hands_over_within_a_retry_period(
        kube: kubernetes.client.ApiClient, namespace: str) -> None:
    prefix = f"p-{uuid.uuid4().hex[:6]}"
    device = "lamp-1"

    async def test(api: AsyncApi) -> None:
        a = ShardOwnership(_settings(namespace, prefix, "corral-0", 1), api)
        b = ShardOwnership(_settings(namespace, prefix, "corral-1", 1), api)
        await a.start()
        await b.start()
        assert a.owns(device) and a.is_leader() and a.epoch(device) is not None
        assert not b.owns(device) and b.epoch(device) is None and b.owned() == frozenset()
        epoch_a = a.epoch(device)
        assert epoch_a is not None

        def never_both() -> None:
            assert not (a.owns(device) and b.owns(device)), "both replicas own the shard"

        # Held steadily over several renewals: still exactly one.
        await asyncio.sleep(LEASE)
        never_both()
        assert a.owns(device) and not b.owns(device)

        await a.stop()
        assert not a.owns(device)
        took = await _until(lambda: b.owns(device), "the standby to own the shard after stop()", LEASE,
                            every=never_both)
        assert took < 2 * RETRY + 0.5, f"the standby took {took:.2f} s after a release, more than about a retry period"
        epoch_b = b.epoch(device)
        assert epoch_b is not None and epoch_b > epoch_a
        await b.stop()

    _run(kube, test)


def test_a_frozen_holder_stops_at_its_deadline_and_is_replaced_only_after_the_lease_duration(
        kube: kubernetes.client.ApiClient, namespace: str) -> None:
    prefix = f"p-{uuid.uuid4().hex[:6]}"
    device = "lamp-1"

    async def test(api: AsyncApi) -> None:
        a = ShardOwnership(_settings(namespace, prefix, "corral-0", 1), api)
        b = ShardOwnership(_settings(namespace, prefix, "corral-1", 1), api)
        lost: list[int] = []

        async def on_lost(shard: int) -> None:
            lost.append(shard)

        async def nothing(shard: int) -> None:
            return None

        a.set_callbacks(nothing, nothing, on_lost)
        await a.start()
        await b.start()
        assert a.owns(device) and not b.owns(device)

        def never_both() -> None:
            assert not (a.owns(device) and b.owns(device)), "both replicas own the shard"

        await asyncio.sleep(1.2)  # a few renewals in, so the deadline is a renewal's, not the acquisition's
        await a.abandon()  # the process is gone: no release, no more renewals
        deadline = a.deadline(0)
        assert deadline is not None
        last_renewal_sent = deadline - RENEW
        assert time.monotonic() - last_renewal_sent < RETRY + 1.0, "the holder had stopped renewing before"
        await _until(lambda: not a.owns(device), "the frozen holder's owns() to turn False", RENEW + 1,
                     every=never_both)
        assert time.monotonic() >= deadline  # owns() held exactly until the deadline, never past it
        await _until(lambda: b.owns(device), "the standby to take the expired Lease", LEASE + 3 * RETRY + 2,
                     every=never_both)
        took_over = time.monotonic()
        # b may take the Lease only once a's last record stood still for a lease duration on b's clock; b saw that
        # record after a sent it, so no earlier than a lease duration after a's last renewal was sent.
        assert took_over >= last_renewal_sent + LEASE, (
            f"the standby took over {took_over - last_renewal_sent:.2f} s after the last renewal, before a lease "
            "duration")
        assert took_over <= last_renewal_sent + LEASE + 2 * RETRY + 1.5, "the standby took too long"
        # The frozen process's own timer (still running in this test's loop) was cancelled by abandon(): a killed
        # process calls nothing. The loss shows in owns() alone.
        assert lost == []
        await b.stop()

    _run(kube, test)


def test_three_members_share_six_shards_and_a_leaving_member_moves_only_its_own(
        kube: kubernetes.client.ApiClient, namespace: str) -> None:
    prefix = f"p-{uuid.uuid4().hex[:6]}"
    shards = 6

    async def test(api: AsyncApi) -> None:
        members = [ShardOwnership(_settings(namespace, prefix, f"corral-{n}", shards), api) for n in range(3)]
        acquired: dict[str, list[int]] = {m.identity: [] for m in members}

        def recorder(member: ShardOwnership) -> Callable[[int], Awaitable[None]]:
            async def on_acquired(shard: int) -> None:
                acquired[member.identity].append(shard)
            return on_acquired

        async def nothing(shard: int) -> None:
            return None

        for member in members:
            member.set_callbacks(recorder(member), nothing, nothing)
        await asyncio.gather(*(m.start() for m in members))

        def no_shard_twice() -> None:
            for k in range(shards):
                holders = [m.identity for m in members if k in m.owned()]
                assert len(holders) <= 1, f"shard {k} owned by {holders}"

        await _until(lambda: sorted(len(m.owned()) for m in members) == [2, 2, 2], "the shards to spread 2/2/2",
                     30, every=no_shard_twice)
        # Stable once spread: a few rounds later nobody has moved.
        before = [m.owned() for m in members]
        await asyncio.sleep(4 * RETRY)
        no_shard_twice()
        assert [m.owned() for m in members] == before

        leaving, staying = members[2], members[:2]
        moving = leaving.owned()
        epochs_before = {k: leaving.shard_epoch(k) for k in moving}
        kept = [m.owned() for m in staying]

        def nothing_else_moves() -> None:
            no_shard_twice()
            for member, had in zip(staying, kept, strict=True):
                assert had <= member.owned(), f"{member.identity} lost {had - member.owned()} while another left"

        await leaving.stop()
        took = await _until(lambda: set().union(*(m.owned() for m in staying)) == set(range(shards)),
                            "the leaving member's shards to move to the others", LEASE + 5, every=nothing_else_moves)
        assert took < LEASE, f"released shards took {took:.2f} s to move"
        assert sorted(len(m.owned()) for m in staying) == [3, 3]
        for k in moving:
            (owner,) = [m for m in staying if k in m.owned()]
            new_epoch = owner.shard_epoch(k)
            old_epoch = epochs_before[k]
            assert old_epoch is not None and new_epoch is not None and new_epoch > old_epoch, (k, old_epoch, new_epoch)
            assert k in acquired[owner.identity]
        await asyncio.sleep(4 * RETRY)
        nothing_else_moves()
        await asyncio.gather(*(m.stop() for m in staying))

    _run(kube, test)


def test_a_device_falls_into_the_shard_its_owner_holds(kube: kubernetes.client.ApiClient, namespace: str) -> None:
    """owns()/epoch() answer per device through the shard hash, the same in every replica."""
    prefix = f"p-{uuid.uuid4().hex[:6]}"

    async def test(api: AsyncApi) -> None:
        a = ShardOwnership(_settings(namespace, prefix, "corral-0", 2), api)
        await a.start()
        assert a.owned() == frozenset({0, 1})  # alone: it holds every shard
        b = ShardOwnership(_settings(namespace, prefix, "corral-1", 2), api)
        await b.start()
        await _until(lambda: a.owned() == frozenset({0}) and b.owned() == frozenset({1}), "one shard each", 15)
        zero, one = _device_of(0, 2), _device_of(1, 2)
        assert a.owns(zero) and not a.owns(one) and b.owns(one) and not b.owns(zero)
        assert a.is_leader() and not b.is_leader()
        assert b.epoch(zero) is None and b.epoch(one) is not None
        await asyncio.gather(a.stop(), b.stop())

    _run(kube, test)
