"""`ShardOwnership`: this replica's share of the shards, held through Leases, and the fence every door checks.

One loop, every retry period: renew this replica's member Lease (`<prefix>-member-<pod>`: how the others count
live members), LIST the fleet's Leases (label `corral.dev/lease-prefix`), renew the shards held, then take or give
back shards as `plan` says. `owns()` is the deadline check itself, made at each call on the monotonic clock: a
loop that stalls, crashes or is cancelled cannot leave a replica acting past its renew deadline.

The callbacks (`set_callbacks`): `acquired(k)` runs as a task of its own once shard k is held (owns() is already
True); `releasing(k)` is awaited, for at most the renew deadline, before shard k is given back (voluntarily or at
stop()); `lost(k)` runs as a task, once, when shard k passed its deadline unrenewed or another took it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from corral.kube.client import AsyncApi, path_of
from corral.obs import metrics
from corral.scale.election import (
    GROUP,
    PLURAL,
    PREFIX_LABEL,
    VERSION,
    Clock,
    LeaseElector,
    WallClock,
    prefix_label,
    record_of,
)
from corral.scale.hashing import shard_of
from corral.scale.ownership import ShardCallback
from corral.scale.plan import LEADER_SHARD, LeaseView, plan
from corral.scale.settings import ScaleSettings

log = logging.getLogger(__name__)


async def _nothing(shard: int) -> None:
    return None


class ShardOwnership:
    def __init__(self, settings: ScaleSettings, api: AsyncApi, *, clock: Clock = time.monotonic,
                 wall: WallClock | None = None) -> None:
        self.settings = settings
        self.shards = settings.shards
        self.identity = settings.identity
        # Renewals have a deadline of seconds: they must not queue behind the controller's own requests (a burst of
        # status writes fills a shared pool), so the Leases get a pool of their own, closed by stop().
        self._api = api.sibling(min(32, settings.shards + 3)) if isinstance(api, AsyncApi) else api
        self._own_pool = self._api is not api
        self._clock = clock
        self._selector = f"{PREFIX_LABEL}={prefix_label(settings.lease_prefix)}"
        labels = {PREFIX_LABEL: prefix_label(settings.lease_prefix)}

        def elector(name: str) -> LeaseElector:
            return LeaseElector(self._api, settings.namespace, name, settings.identity, labels=labels, clock=clock,
                                wall=wall, lease_duration_s=settings.lease_duration_s,
                                renew_deadline_s=settings.renew_deadline_s)

        self._shard = [elector(settings.shard_lease(k)) for k in range(settings.shards)]
        self._member = elector(settings.member_lease())
        self._members: dict[str, tuple[object, float, float]] = {}  # other members: (record, first seen, duration)
        self._acquired: ShardCallback = _nothing
        self._releasing: ShardCallback = _nothing
        self._lost: ShardCallback = _nothing
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._giving_back: dict[int, asyncio.Task[None]] = {}  # a shard's `releasing` then release, beside the loop
        self._loops: list[asyncio.Task[None]] = []
        self._crashed = False
        self._stopping = False
        self.live_members = 1

    # ---- the Ownership protocol: cheap, synchronous, checked at every door ----------------------------------

    def owns(self, device_id: str) -> bool:
        return self._valid(shard_of(device_id, self.shards))

    def epoch(self, device_id: str) -> int | None:
        elector = self._shard[shard_of(device_id, self.shards)]
        return elector.epoch if self._valid_elector(elector) else None

    def is_leader(self) -> bool:
        return self._valid(LEADER_SHARD)

    def owned(self) -> frozenset[int]:
        return frozenset(k for k in range(self.shards) if self._valid(k))

    def shard_epoch(self, shard: int) -> int | None:
        elector = self._shard[shard]
        return elector.epoch if self._valid_elector(elector) else None

    def deadline(self, shard: int) -> float | None:
        """The monotonic time (time.monotonic()) at which this replica stops owning `shard` unless it renews it
        first; None when it does not hold it."""
        elector = self._shard[shard]
        return elector.valid_until if self._valid_elector(elector) else None

    def _valid(self, shard: int) -> bool:
        return self._valid_elector(self._shard[shard])

    def _valid_elector(self, elector: LeaseElector) -> bool:
        return not self._crashed and elector.valid()

    def set_callbacks(self, acquired: ShardCallback, releasing: ShardCallback, lost: ShardCallback) -> None:
        self._acquired, self._releasing, self._lost = acquired, releasing, lost

    # ---- life -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """One round (so a replica that can hold shards holds them when this returns), then the loop."""
        if self._loops:
            raise RuntimeError("ShardOwnership.start() called twice")
        began = self._clock()
        await self._renew()
        await self._plan()
        # Two loops: renewals never wait for a slow LIST or acquisition (their deadline is the fence), and the plan
        # never waits for a slow renewal.
        for what, step in (("renew", self._renew), ("plan", self._plan)):
            task = asyncio.create_task(self._every_period(step, began, watch_lag=what == "renew"),
                                       name=f"shard {what} loop {self.identity}")
            task.add_done_callback(self._loop_ended)
            self._loops.append(task)

    async def stop(self) -> None:
        """Stop the loop, give back every held shard (after `releasing`), then the member Lease. Deletes nothing."""
        self._stopping = True
        await self._halt()
        for k in range(self.shards):
            if self._shard[k].holding and k not in self._giving_back:
                self._start_giving_back(k)
        await asyncio.gather(*self._giving_back.values(), return_exceptions=True)
        metrics.SHARDS_HELD.set(0)
        with contextlib.suppress(Exception):
            await self._member.release()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_pool()

    async def _close_pool(self) -> None:
        if self._own_pool and isinstance(self._api, AsyncApi):
            await self._api.close()

    async def abandon(self) -> None:
        """Stop the loop and its timers without releasing anything or calling anyone: what a killed process
        leaves behind (the failover tests). owns() still turns False at each shard's renew deadline."""
        await self._halt()
        for task in [*self._giving_back.values(), *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._giving_back.values(), *self._tasks, return_exceptions=True)
        await self._close_pool()

    async def _halt(self) -> None:
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            # A bug, not an API error (those are caught per round): act on nothing from now on, say so loudly.
            self._crashed = True
            for other in self._loops:
                other.cancel()
            log.error("shard ownership loop of %s crashed (%s); this replica now owns nothing", self.identity,
                      task.get_name(), exc_info=error)
            for k in range(self.shards):
                self._lose(k, "the ownership loop crashed")

    async def _every_period(self, step: Callable[[], Awaitable[None]], began: float, watch_lag: bool) -> None:
        period = self.settings.retry_period_s
        while True:
            # A step starts every period; one that overran (a slow API server) is followed at once.
            pause = max(0.0, period - (self._clock() - began))
            asleep = self._clock()
            await asyncio.sleep(pause)
            began = self._clock()
            lag = began - asleep - pause
            if watch_lag and lag > self.settings.renew_deadline_s / 3:
                # Other work held the event loop that long: renewals wait for it, and past the renew deadline the
                # shards are lost. Said here because a loss alone does not say why.
                log.warning("%s: the renew loop woke %.1f s late (a busy event loop); the renew deadline is %g s",
                            self.identity, lag, self.settings.renew_deadline_s)
            await step()

    # ---- renewing (the renew loop) --------------------------------------------------------------------------

    async def _renew(self) -> None:
        """The member Lease and every held shard at once, each on the optimistic fast path (one PUT)."""
        self._lose_overdue()
        held = [k for k in range(self.shards) if self._shard[k].holding]
        _, *renewed = await asyncio.gather(
            self._attempt(self._member, "renew the member Lease"),
            *(self._attempt(self._shard[k], f"renew shard {k}", acquire=False) for k in held))
        for k, ok in zip(held, renewed, strict=True):
            elector = self._shard[k]
            if ok and elector.holding:
                self._arm(k)
            elif elector.holding and elector.missing:
                # Deleted under us: anyone may create it now, so the fence cannot wait for the deadline.
                self._lose(k, "its Lease was deleted")
            elif elector.holding and elector.observed is not None and elector.observed.holder != self.identity:
                self._lose(k, f"its Lease is held by {elector.observed.holder or 'nobody'} now")
        self._lose_overdue()
        metrics.SHARDS_HELD.set(len(self.owned()))

    # ---- planning (the plan loop) ---------------------------------------------------------------------------

    async def _plan(self) -> None:
        """LIST the fleet's Leases, count live members, then take or give back shards as `plan` says."""
        if self._stopping:
            return
        try:
            listed = await asyncio.wait_for(self._list(), self.settings.renew_deadline_s)
        except Exception as err:  # noqa: BLE001 - an unreachable API server is a round without a plan, not a crash
            log.warning("%s could not list the Leases of %r: %s", self.identity, self.settings.lease_prefix,
                        str(err) or type(err).__name__)
            return
        self._observe(listed)
        now = self._clock()
        views = {k: LeaseView(holder=e.observed.holder or None, expired=not e.lease_valid(now))
                 for k, e in enumerate(self._shard) if e.observed is not None}
        mine = frozenset(k for k in range(self.shards) if self._shard[k].valid(now))
        step = plan(self.shards, self.identity, views, self.live_members, mine)
        if step.acquire and not self._stopping:
            got = await asyncio.gather(*(self._attempt(self._shard[k], f"acquire shard {k}", read=False)
                                         for k in step.acquire))
            for k, ok in zip(step.acquire, got, strict=True):
                if ok:
                    self._on_acquired(k)
            metrics.SHARDS_HELD.set(len(self.owned()))
        for k in step.release:
            if k in self._giving_back or self._stopping:
                continue
            log.info("giving back shard %d (epoch %s) of %s: %d live members, a share of %d", k,
                     self._shard[k].epoch, self.identity, self.live_members, len(mine) - len(step.release))
            self._start_giving_back(k)

    def _lose_overdue(self) -> None:
        """Shards past their deadline are lost before anything else, even if the timer has not fired yet (a loop
        that stalled past it): a renewal then would carry on as if work had not stopped; it is taken anew instead."""
        now = self._clock()
        for k, elector in enumerate(self._shard):
            if elector.holding and now >= elector.valid_until:
                self._lose(k, f"no renewal within the renew deadline ({self.settings.renew_deadline_s:g} s)")

    async def _list(self) -> list[dict[str, Any]]:
        answer = await self._api.request("GET", path_of(GROUP, VERSION, PLURAL, self.settings.namespace),
                                         params={"labelSelector": self._selector})
        return list(answer.get("items") or [])

    def _observe(self, items: list[dict[str, Any]]) -> None:
        by_name = {str((item.get("metadata") or {}).get("name")): item for item in items}
        for elector in self._shard:
            if not elector.holding:  # a held one is the renew loop's: its own writes are fresher than this LIST
                elector.observe(by_name.get(elector.name))
        own = self._member.name
        member_prefix = f"{self.settings.lease_prefix}-member-"
        now = self._clock()
        seen: dict[str, tuple[object, float, float]] = {}
        for name, item in by_name.items():
            if not name.startswith(member_prefix) or name == own:
                continue
            record = record_of(item)
            if not record.holder:
                continue  # released: that member stopped
            before = self._members.get(name)
            first_seen = before[1] if before is not None and before[0] == record else now
            seen[name] = (record, first_seen, float(record.lease_duration_s))
        self._members = seen
        # This replica counts itself; another member counts while its record changed within its lease duration.
        self.live_members = 1 + sum(1 for _, first, duration in seen.values() if now < first + duration)

    async def _attempt(self, elector: LeaseElector, what: str, read: bool = True, acquire: bool = True) -> bool:
        try:
            return await elector.try_acquire_or_renew(read=read, acquire=acquire)
        except Exception as err:  # noqa: BLE001 - the API server's refusals and timeouts: retried next round
            log.warning("%s could not %s (Lease %s): %s", self.identity, what, elector.name,
                        str(err) or type(err).__name__)
            return False

    # ---- acquiring, giving back, losing ---------------------------------------------------------------------

    def _on_acquired(self, k: int) -> None:
        elector = self._shard[k]
        log.info("acquired shard %d (Lease %s, epoch %s, transitions %s) as %s", k, elector.name, elector.epoch,
                 elector.observed.transitions if elector.observed else "?", self.identity)
        self._arm(k)
        metrics.SHARD_CHANGES.labels("acquired").inc()
        self._spawn(self._acquired(k), f"acquired shard {k}")

    def _start_giving_back(self, k: int) -> None:
        """`releasing` may take up to the renew deadline (in-flight Intents ending): the loop goes on renewing every
        shard meanwhile, this one included, since its work runs until the release."""
        task = asyncio.get_running_loop().create_task(self._give_back(k), name=f"give back shard {k}")
        self._giving_back[k] = task
        task.add_done_callback(lambda done: self._given_back(k, done))

    def _given_back(self, k: int, task: asyncio.Task[None]) -> None:
        if self._giving_back.get(k) is task:
            del self._giving_back[k]
        if not task.cancelled() and task.exception() is not None:
            log.error("giving back shard %d failed", k, exc_info=task.exception())

    async def _give_back(self, k: int) -> None:
        try:
            await asyncio.wait_for(self._releasing(k), self.settings.renew_deadline_s)
        except Exception as err:  # noqa: BLE001 - a callback's failure or overrun must not keep the shard held
            log.warning("releasing callback of shard %d failed or overran (%s); giving it back anyway", k,
                        err or type(err).__name__)
        timer = self._timers.pop(k, None)
        if timer is not None:
            timer.cancel()
        elector = self._shard[k]
        epoch = elector.epoch
        try:
            await elector.release()  # stops counting it as held before the request goes out
        except Exception as err:  # noqa: BLE001 - unreleased, it expires after a lease duration instead
            elector.drop()
            log.warning("%s could not release shard %d: %s (it expires in %g s instead)", self.identity, k, err,
                        self.settings.lease_duration_s)
            return
        metrics.SHARD_CHANGES.labels("released").inc()
        log.info("released shard %d (epoch %s) as %s", k, epoch, self.identity)

    def _arm(self, k: int) -> None:
        """A timer at the shard's renew deadline: `lost` is called on time even if the loop is stuck in a request."""
        timer = self._timers.pop(k, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        delay = self._shard[k].valid_until - self._clock()
        self._timers[k] = loop.call_at(loop.time() + max(0.0, delay), self._expire, k)

    def _expire(self, k: int) -> None:
        self._timers.pop(k, None)
        elector = self._shard[k]
        if elector.holding and self._clock() >= elector.valid_until:
            self._lose(k, f"no renewal within the renew deadline ({self.settings.renew_deadline_s:g} s)")
        elif elector.holding:
            self._arm(k)  # renewed meanwhile without re-arming (should not happen): check again at the new deadline

    def _lose(self, k: int, why: str) -> None:
        elector = self._shard[k]
        if not elector.holding:
            return
        epoch = elector.epoch
        elector.drop()
        timer = self._timers.pop(k, None)
        if timer is not None:
            timer.cancel()
        metrics.SHARD_CHANGES.labels("lost").inc()
        log.warning("lost shard %d (epoch %s) as %s: %s", k, epoch, self.identity, why)
        self._spawn(self._lost(k), f"lost shard {k}")

    def _spawn(self, call: Awaitable[None], what: str) -> None:
        async def run() -> None:
            await call

        task = asyncio.get_running_loop().create_task(run(), name=f"{what} ({self.identity})")
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._callback_done(done, what))

    def _callback_done(self, task: asyncio.Task[None], what: str) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("callback %s failed", what, exc_info=task.exception())
