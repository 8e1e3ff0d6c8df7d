"""What sharding adds to the controller's loop (docs/scale.md): the gates in front of each queue's reconciler, which
drop the keys of devices this replica does not own, and what the `Ownership` sets going through its callbacks
when a shard was acquired (its devices and unfinished Intents are queued again, an executing one pinned to its
command id), is being released (its executions in flight end first) or was lost. The leader (the holder of
shard 0) alone keeps the broker's accounts and deletes unused Capabilities. A controller alone passes every gate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from corral.api.codes import FINAL_PHASES
from corral.kube.cache import Key
from corral.kube.workqueue import Result, WorkQueue
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.capabilities import Capabilities
from corral.reconcile.devices.port import FleetPort
from corral.reconcile.devices.reconciler import DeviceReconciler
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.doors import Doors, NotOwned
from corral.reconcile.intents.execute import new_command_id
from corral.reconcile.intents.facts import StoredIntent, name_of, status_of, uid_of, value_of
from corral.reconcile.intents.holds import pending
from corral.reconcile.intents.wiring import IntentController
from corral.reconcile.mqttside import MqttSide

log = logging.getLogger(__name__)

# How long an acquired shard's devices are waited for (their retained info and status, sent again on subscribing)
# before its Intents are taken up: long against the broker's redelivery, short against a failover's budget.
HEARD_S = 3.0
# Shards acquired within this long of each other share one re-subscription.
REDELIVERY_BATCH_S = 0.2


class ShardWork:
    def __init__(self, doors: Doors, devices: DeviceCache, fleet: Fleet, queue: WorkQueue[str],
                 device_reconciler: DeviceReconciler, intents: IntentController, port: FleetPort, mqtt: MqttSide,
                 capabilities: Capabilities, command_timeout_s: float) -> None:
        self.doors, self.devices, self.fleet, self.queue = doors, devices, fleet, queue
        self.device_reconciler, self.intents, self.port = device_reconciler, intents, port
        self.mqtt, self.capabilities, self.command_timeout_s = mqtt, capabilities, command_timeout_s
        self._leading = False
        self._redelivery: asyncio.Future[None] | None = None
        self._executing: dict[int, int] = {}  # executions in flight, by shard: a release waits for them

    # ---- the gates: each queue's keys, for devices this replica owns ------------------------------------

    async def reconcile_device(self, device_id: str) -> Result:
        if not self.doors.takes(device_id):
            return Result.done()  # its owner reconciles it; queued again here if its shard is acquired
        try:
            return await self.device_reconciler.reconcile(device_id)
        except NotOwned:
            return Result.done()  # the shard was lost mid-way: the door refused, its new owner carries on

    async def decide_intent(self, key: Key) -> Result:
        intent = self.intents.intents.get(key)
        # A malformed Intent names no readable Device: the leader answers it.
        device_id = self.doors.device_id(key[0], intent.spec.device) if intent is not None else None
        if not self.doors.takes(device_id):
            return Result.done()
        try:
            return await self.intents.reconciler.reconcile(key)
        except NotOwned:
            return Result.done()
        finally:
            self._unpin_ended(key, device_id)

    def _unpin_ended(self, key: Key, device_id: str | None) -> None:
        """An ended Intent holds no pin (one pinned at a takeover and then decided otherwise)."""
        intent = self.intents.intents.get(key)
        if self.doors.sharded and intent is not None and device_id is not None \
                and status_of(intent).phase in FINAL_PHASES:
            self.port.release_command(device_id, status_of(intent).command_id or new_command_id(uid_of(intent)))

    async def execute_intents(self, device_key: Key) -> Result:
        device_id = self.doors.device_id(*device_key)
        if not self.doors.takes(device_id):
            # Not ours (any more): what was handed over here is decided again by the owner (requeued on acquire).
            self.intents.executor.handovers.ready.pop(device_key, None)
            return Result.done()
        shard = self._shard(device_id)
        self._executing[shard] = self._executing.get(shard, 0) + 1
        try:
            return await self.intents.executor.reconcile(device_key)
        except NotOwned:
            self.intents.executor.handovers.ready.pop(device_key, None)
            return Result.done()
        finally:
            self._executing[shard] -= 1

    # ---- what the Ownership tells -----------------------------------------------------------------------

    async def acquired(self, shard: int) -> None:
        """A shard is ours now: learn its devices as they are (retained info and status again), reconcile each,
        and take up its unfinished Intents (an Executing one resumes with its command id)."""
        # Until its devices are heard again, a Device event would find no runtime and write the device off as
        # waiting: its new work waits too (the gates), and everything is queued once they were heard.
        self.doors.waiting.add(shard)
        if shard == 0:
            await self.lead()
        await self._redelivered()
        await self._heard(shard)
        unfinished = self._unfinished(shard)
        pinned = self._pin_inherited(unfinished)
        self.doors.waiting.discard(shard)
        for known in {*self.devices.device_ids(), *(rt.device_id for rt in self.fleet.values())}:
            if self.doors.shard(known) == shard:
                self.queue.add(known)
        for key, _intent, _device_id in unfinished:
            self.intents.decisions.add(key)
        for key, intent in self.intents.intents.items():
            # A timed hold of the shard runs out here now: its state is in the Intent's status (holds.py).
            if pending(intent) and self._shard(self.doors.device_id(key[0], intent.spec.device)) == shard:
                self.intents.decisions.add(key)
        log.info("acquired shard %d: its devices queued, %d unfinished Intent(s) taken up (%d with their command "
                 "pinned)", shard, len(unfinished), pinned)

    def _unfinished(self, shard: int) -> list[tuple[Key, StoredIntent, str | None]]:
        """The shard's Intents not ended yet, with their device's id (None: no Device, the leader's, shard 0)."""
        found = []
        for key, intent in self.intents.intents.items():
            if status_of(intent).phase in FINAL_PHASES:
                continue
            device_id = self.doors.device_id(key[0], intent.spec.device)
            if self._shard(device_id) == shard:
                found.append((key, intent, device_id))
        return found

    def _shard(self, device_id: str | None) -> int:
        """The shard whose holder answers for the device; work on no readable Device is the leader's."""
        return self.doors.shard(device_id) if device_id else 0

    def _pin_inherited(self, unfinished: list[tuple[Key, StoredIntent, str | None]]) -> int:
        """As `IntentController.prime` at a restart, for a shard taken over: an Intent the previous owner may have
        been executing (any not ended nor awaiting approval: this replica cannot read the other's audit log) may have had its
        target applied and its command sent. Its command is pinned with the Intent's own id before the devices are
        reconciled, so the device reconciler leaves that actuator alone until the Intent, taken up, applies its
        target and sends that id, which the firmware answers from its memory if it ran already; otherwise the
        device reconciler could drive that target with an id of its own (seen in this replica's cache a moment
        later), and the hardware would act twice. Not the target as cached: the cache may lag. A pin the Intent
        never uses (decided otherwise) is released when it ends."""
        pinned = 0
        for _key, intent, device_id in unfinished:
            status, value = status_of(intent), value_of(intent)
            # Not one that waits for a person: its pin would hold the actuator for as long.
            if status.phase == "AwaitingApproval" or value is None or device_id is None or intent.spec.dry_run:
                continue
            self.port.pin(device_id, intent.spec.actuator, value, status.command_id or new_command_id(uid_of(intent)),
                          name_of(intent), None)
            pinned += 1
        return pinned

    async def _redelivered(self) -> None:
        """One re-subscription for the shards acquired together (a replica starting takes several at once): each
        makes the broker send every device's retained info and status again, which the owned devices' intake
        parses; one per shard would parse each contract as many times."""
        if self._redelivery is None or self._redelivery.done():
            self._redelivery = asyncio.ensure_future(self._redeliver_soon())
        await asyncio.shield(self._redelivery)

    async def _redeliver_soon(self) -> None:
        await asyncio.sleep(REDELIVERY_BATCH_S)
        self.mqtt.redeliver()

    async def _heard(self, shard: int) -> None:
        """Until the shard's enrolled devices were heard again (their retained contract and presence), for at most
        HEARD_S: a standby dropped their messages, and an Intent decided before would find its device unknown, or
        (its contract heard, its status not yet) offline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HEARD_S
        while loop.time() < deadline:
            missing = unheard(self.devices.device_ids(), self.fleet, lambda d: self.doors.shard(d) == shard)
            if not missing:
                return
            await asyncio.sleep(0.1)
        log.info("shard %d: %d device(s) not heard within %g s of its acquisition (offline, or no contract yet)",
                 shard, len(missing), HEARD_S)

    async def releasing(self, shard: int) -> None:
        """A shard is to be handed over: no new work for it, and its executions in flight end first (bounded by
        the command timeout; one still running then is resumed by the next owner with its command id)."""
        self.doors.waiting.add(shard)
        if shard == 0:
            await self.follow()
        deadline = asyncio.get_running_loop().time() + self.command_timeout_s
        while self._executing.get(shard, 0) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        log.info("releasing shard %d%s", shard,
                 "" if not self._executing.get(shard, 0) else " with executions still in flight (the next owner "
                 "resumes them)")

    async def lost(self, shard: int) -> None:
        """Past the renew deadline: the doors refuse already; only the leader's own loops are stopped."""
        log.warning("lost shard %d: past the renew deadline, nothing more is sent or written for its devices", shard)
        if shard == 0:
            await self.follow()

    async def lead(self) -> None:
        if self._leading:
            return
        self._leading = True
        self.capabilities.start()
        self.mqtt.lead()

    async def follow(self) -> None:
        if not self._leading:
            return
        self._leading = False
        await self.capabilities.stop()
        await self.mqtt.follow()


def unheard(device_ids: Iterable[str], fleet: Fleet, in_shard: Callable[[str], bool]) -> list[str]:
    """The devices of a shard whose retained contract or presence has not come in yet. Both are needed: the
    contract arrives first, and a device whose `online` was not heard yet would be judged offline."""
    return [d for d in device_ids if in_shard(d)
            and ((rt := fleet.get(d)) is None or rt.contract is None or rt.online is None)]
