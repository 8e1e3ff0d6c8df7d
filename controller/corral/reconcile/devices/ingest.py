"""What devices say over MQTT, taken in: parsed, checked, recorded in the runtime, and queued.

The MQTT link hands every message over on the event loop (`call_soon_threadsafe`). Nothing here waits:
a message updates what the controller knows about its device and, when that deserves a reconcile,
queues the device id. Every payload is untrusted (`devices.messages` parses and bounds it); a bad one
is logged, and a bad contract makes the device inert until it announces a good one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from corral.api.capability import capability_name
from corral.contract.diff import contract_diff
from corral.contract.model import Contract
from corral.contract.signature import verify
from corral.devices import messages
from corral.devices.limits import BurstReport, DeviceLimits
from corral.devices.link import Inbound
from corral.devices.presence import Presence
from corral.devices.telemetry import Coalescing
from corral.devices.topics import Topics
from corral.kube.workqueue import WorkQueue
from corral.obs import metrics
from corral.reconcile.devices.driver import CommandTimeout, DeviceGone, Driver
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.runtime import DeviceRuntime, Fleet
from corral.reconcile.devices.status import sensors_due
from corral.reconcile.devices.trust import ContractTrust

log = logging.getLogger(__name__)

# What a device may send at its own pace only: each costs work downstream (a state change is an audit record
# and an Event, samples may be a status write). Not `info` (judged as a contract, held when it changes), not
# `status` (its Will: an `offline` must never be dropped), not `ack` (answers to our own commands).
LIMITED = ("event", "telemetry")
# A broker log line saying a device went away is checked before it is believed: anyone may try to log in with a
# device's client id, and the broker logs that refusal with the id (those lines are left out, devices.presence, but
# a log is no proof). A device that answers a get_state within this time is connected.
PROBE_S = 2.0
# Messages only a connected device can send (its account's ACLs let nobody else publish there): heard live from a
# device marked offline, it is back.
SPOKEN = ("ack", "telemetry", "event")
# Judged always (the newest contract is what holds or frees the device), but a changed contract takes a token
# too: over the limit it is counted in the flood's reports instead of recorded (contract.changed) one by one.
COUNTED = ("info",)


class Ingest:
    def __init__(self, topics: Topics, fleet: Fleet, queue: WorkQueue[str], driver: Driver, notices: DeviceNotices,
                 coalescing: Coalescing, bound: Callable[[str], bool], trust: ContractTrust,
                 require_signatures: bool = False, signing_keys: Mapping[str, Ed25519PublicKey] | None = None,
                 limits: DeviceLimits | None = None, barred: Callable[[str], bool] = lambda device_id: False) -> None:
        self.topics = topics
        # Whether the broker refuses this device id (its enrollment is revoked): it cannot be online, whatever an
        # old retained status says (reconcile.accounts).
        self.barred = barred
        self.trust = trust
        self.bound = bound  # whether a Device binds this device id: only those are driven
        self.fleet = fleet
        self.queue = queue
        self.driver = driver
        self.notices = notices
        self.coalescing = coalescing
        self.require_signatures = require_signatures
        self.signing_keys = dict(signing_keys or {})
        self.link_up_since = 0.0
        # Per device, what may cost work downstream (records, Events, status writes): devices.limits.
        self.limits = limits if limits is not None else DeviceLimits()
        self._tick: asyncio.TimerHandle | None = None
        self._probes: dict[str, asyncio.Task[None]] = {}  # device id -> the get_state that checks a log line
        # Every telemetry message's samples, handed on (the controller's history, `--history-dir`): called on the
        # loop, so it must not block.
        self.history: Callable[[str, Contract | None, Sequence[messages.Sample], float], None] | None = None

    def on_message(self, message: Inbound) -> None:
        parsed = self.topics.parse(message.topic)
        if parsed is None:
            return
        device_id, kind = parsed
        rt = self.fleet.get(device_id)
        if rt is None:
            if kind in ("info", "status") and (kind == "status" or not self.bound(device_id)):
                # Not driven yet: no Device binds the id, or its status came before its contract (MQTT
                # orders messages per topic only). Kept, bounded, for when it is.
                self.fleet.keep(device_id, kind, message.payload)
            if kind != "info" or not self.bound(device_id):
                return  # a device becomes known through its contract, and only with a Device that binds it
            rt = self.fleet.add(device_id)
            metrics.device_online_changed(None, rt.online, new=True)
        if kind in LIMITED and not self._admit(device_id, kind):
            return
        if kind in SPOKEN and rt.online is False and not message.retained and not self.barred(device_id):
            self._set_online(rt, True, f"it sent a live {kind} message, which only a connected device can")
            self.queue.add(device_id)
        try:
            if kind == "info":
                self._on_info(rt, message.payload)
            elif kind == "status":
                self._on_status(rt, message.payload)
            elif kind == "ack":
                self._on_ack(rt, message.payload)
            elif kind == "telemetry":
                self._on_telemetry(rt, message.payload)
            elif kind == "event":
                self._on_event(rt, message.payload)
        except messages.BadMessage as err:
            log.warning("device %s sent a bad %s message: %s", device_id, kind, err)
            if kind == "info":
                self._refuse_contract(rt, str(err))

    def _admit(self, device_id: str, kind: str) -> bool:
        """Whether the device is under its limit; over it, the message is counted, and a burst told in a few
        reports (a record and a Warning Event each), never one by one."""
        taken, report = self.limits.admit(device_id, time.monotonic())
        if taken:
            return True
        metrics.DEVICE_MESSAGES_DROPPED.labels(kind=kind).inc()
        if report is not None:
            self._tell_flood(device_id, report)
        self._schedule_tick()
        return False

    def _tell_flood(self, device_id: str, report: BurstReport) -> None:
        limit = {"ratePerSecond": self.limits.rate, "burst": self.limits.burst}
        self.notices.fact("device.flooding", device_id, {"phase": report.phase, "dropped": report.dropped,
                                                         "droppedInBurst": report.total, "limit": limit,
                                                         "kinds": [*LIMITED, *COUNTED]})
        what = f"{'/'.join((*LIMITED, *COUNTED))} messages from device {device_id}"
        self.notices.post_for(device_id, "Flooding", "Drop", report.words(what) +
                              f" (limit {self.limits.rate:g}/s, burst {self.limits.burst})", "Warning")
        if report.phase == "started":
            log.warning("device %s is over its message limit (%g/s, burst %d): dropping and counting", device_id,
                        self.limits.rate, self.limits.burst)
        elif report.phase == "ended":
            log.warning("device %s is back under its message limit; %d message(s) dropped in the burst", device_id,
                        report.total)

    def _schedule_tick(self) -> None:
        when = self.limits.next_tick()
        if when is None or (self._tick is not None and self._tick.when() <= self._loop_time(when)):
            return
        if self._tick is not None:
            self._tick.cancel()
        delay = max(0.0, when - time.monotonic())
        self._tick = asyncio.get_running_loop().call_later(delay, self._on_tick)

    @staticmethod
    def _loop_time(monotonic: float) -> float:
        """A time.monotonic() instant on the loop's clock (the same clock on Linux, but not promised)."""
        return asyncio.get_running_loop().time() + (monotonic - time.monotonic())

    def _on_tick(self) -> None:
        self._tick = None
        for device_id, report in self.limits.tick(time.monotonic()):
            self._tell_flood(device_id, report)
        self._schedule_tick()

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for probe in self._probes.values():
            probe.cancel()

    def adopt(self, device_id: str) -> None:
        """A Device now binds this id: take in what the device said before (its retained info and status)."""
        if self.fleet.get(device_id) is not None:
            return
        info = self.fleet.take(device_id, "info")
        if info is not None:
            self.on_message(Inbound(self.topics.of(device_id, "info"), info, retained=True))

    def on_connected(self) -> None:
        """After (re)connecting: states may have changed while we could not hear them."""
        self.link_up_since = time.monotonic()
        for rt in self.fleet.values():
            rt.state_known = False
            self.queue.add(rt.device_id)

    # ---- by kind --------------------------------------------------------------------------------------------

    def _on_info(self, rt: DeviceRuntime, payload: bytes) -> None:
        first = not rt.announced_contract
        try:
            contract = messages.parse_info(payload, rt.device_id)
            # A bridged Device's contract comes unsigned from the bridge: a person's acceptance (its content hash,
            # spec.bridge.acceptedContractHash) stands in for the signature (contract.trust.first_bridged).
            if self.require_signatures and not self.trust.bridged(rt.device_id):
                check = verify(contract, self.signing_keys)
                if check.outcome != "valid":
                    raise messages.BadMessage(f"contract signature {check.outcome}: {check.detail}")
                if contract.version is None:
                    raise messages.BadMessage("a signed contract must carry its version (the contract field "
                                              "`version`), so that an older one can be refused as a replay")
        finally:
            pending = self.fleet.take(rt.device_id, "status") if first else None
            if pending is not None:
                self._status_of_new_device(rt, pending)
        previous = rt.contract
        rt.contract, rt.contract_error = contract, None
        rt.capability = capability_name(contract)
        rt.capability_ensured = (rt.capability_ensured and previous is not None
                                 and rt.capability == capability_name(previous))
        self._touch(rt)
        # Judged now, before anything can act on the new contract: a hold or refusal is in force at once.
        refused = self.trust.judge(rt)
        if refused is not None:
            self._refuse_contract(rt, refused)
            return
        if previous is not None and capability_name(previous) != rt.capability and self._admit(rt.device_id, "info"):
            changes = contract_diff(previous, contract)
            self.notices.fact("contract.changed", rt.device_id, {"from": capability_name(previous),
                                                                 "to": rt.capability, "changes": changes})
            if not rt.hold:  # a held change is told by ContractHeld (once) and the condition (always the latest)
                self.notices.post_for(rt.device_id, "ContractChanged", "Observe",
                                      "The device announced a changed contract: " + "; ".join(changes))
        self.queue.add(rt.device_id)

    def _status_of_new_device(self, rt: DeviceRuntime, payload: bytes) -> None:
        try:
            self._on_status(rt, payload)
        except messages.BadMessage as err:
            log.warning("device %s sent a bad status message before its contract: %s", rt.device_id, err)

    def _refuse_contract(self, rt: DeviceRuntime, why: str) -> None:
        rt.contract, rt.contract_error = None, why
        rt.announced.discard("contract-refused")
        self.queue.add(rt.device_id)

    def _on_status(self, rt: DeviceRuntime, payload: bytes) -> None:
        online = messages.parse_status(payload)
        if online and self.barred(rt.device_id):
            # Only a retained word from before the revocation can say so: the broker lets the device in no more.
            self._set_online(rt, False, "its enrollment is revoked (corral devices revoke): the broker refuses it, "
                                        "and its retained `online` is from before")
        elif online:
            rt.online_at = time.monotonic()
            self._set_online(rt, True, "it said so on its status topic")
        else:
            self._set_online(rt, False, "its status topic says so (its own word, or its Last Will when its connection "
                                        "broke)")
        self._touch(rt)
        self.queue.add(rt.device_id)

    def disconnected(self, device_id: str, why: str, since: float | None = None) -> None:
        """The broker threw the device off without its Will (reconcile.accounts, or its log): offline now, unless it
        said `online` again after `since` (a monotonic time: when what tells it was read), which is newer news."""
        rt = self.fleet.get(device_id)
        if rt is None or (since is not None and rt.online_at > since):
            return
        if self.barred(device_id):
            # Revoked: no ack can come, so an Intent waiting for one ends DEVICE_GONE now instead of TIMEOUT later.
            self.driver.expectations.fail_device(device_id, DeviceGone(
                f"device {device_id} was revoked (its broker account disabled) while the command waited for its "
                "ack; the target stays set and is driven if it is enrolled again"))
        if rt.online is False:
            return
        self._set_online(rt, False, why)
        self.notices.fact("device.disconnected", device_id, {"why": why})
        self.queue.add(device_id)

    def on_broker_presence(self, words: Mapping[str, Presence], read_at: float) -> None:
        """What the broker's log said about connections (reconcile.refusals reads it): a device it last said went
        away is offline if it does not answer a get_state at once, unless it said `online` after the log was read."""
        for client, presence in words.items():
            rt = self.fleet.get(client)
            if presence.connected or rt is None or rt.online is not True or client in self._probes:
                continue
            self._probes[client] = asyncio.get_running_loop().create_task(
                self._confirm_gone(client, presence.why(), read_at), name=f"corral-presence-{client}")

    async def _confirm_gone(self, device_id: str, why: str, read_at: float) -> None:
        try:
            await self.driver.get_state(device_id, PROBE_S)
        except CommandTimeout:
            self.disconnected(device_id, f"{why}, and it did not answer within {PROBE_S:g} s", since=read_at)
        except Exception:  # a probe that cannot be sent (the link is down) proves nothing either way
            log.debug("could not check whether device %s is connected", device_id, exc_info=True)
        finally:
            self._probes.pop(device_id, None)

    def _set_online(self, rt: DeviceRuntime, online: bool, why: str) -> None:
        if online == rt.online:
            return
        before, rt.online = rt.online, online
        metrics.device_online_changed(before, online)
        rt.state_known = False  # a device that was away may have restarted with other state
        rt.failures, rt.next_attempt = 0, 0.0
        if before is None:
            return  # the first word after a (re)start is no news for people: a fleet would post one Event each
        if online:
            self.notices.post_for(rt.device_id, "Online", "Connect", f"The device is online ({why}).")
        else:
            self.notices.post_for(rt.device_id, "Offline", "Disconnect", f"The device is offline: {why}.")

    def _on_ack(self, rt: DeviceRuntime, payload: bytes) -> None:
        ack = messages.parse_ack(payload)
        self._touch(rt)
        if ack.state:
            rt.failsafe = dict(ack.failsafe)  # every ack carries the full state, and which of it is a failsafe's
            rt.max_on = dict(ack.max_on or {})  # ... and which of it an on-time limit switched off
        self.driver.on_ack(rt.device_id, ack)

    def _on_telemetry(self, rt: DeviceRuntime, payload: bytes) -> None:
        telemetry = messages.parse_telemetry(payload)
        self._touch(rt)
        received_ms = time.time() * 1000
        for sample in telemetry.samples:
            rt.buffer.add(sample, received_ms)
        if self.history is not None:
            self.history(rt.device_id, rt.contract, telemetry.samples, received_ms)
        sensors = {s.metric: s for s in rt.contract.sensors} if rt.contract else {}
        if sensors_due(rt.memory, rt.buffer.latest, sensors, self.coalescing, time.monotonic()):
            self.queue.add(rt.device_id)

    def _on_event(self, rt: DeviceRuntime, payload: bytes) -> None:
        event = messages.parse_event(payload)
        self._touch(rt)
        if event.state is not None:
            # The device reports its whole state after a local change, a restart or a failsafe.
            rt.failsafe = dict(event.failsafe)
            rt.max_on = dict(event.max_on or {})
            changed = rt.report(dict(event.state))
            cause = f"the device reported its state ({event.value})"
            if event.value == "failsafe":
                cause += ": " + "; ".join(r.cause(a) for a, r in sorted(event.failsafe.items()))
            elif event.value == "max_on":
                cause += ": " + "; ".join(r.cause(a) for a, r in sorted((event.max_on or {}).items()))
            self.notices.state_changed(rt, changed, cause)
            self.queue.add(rt.device_id)

    @staticmethod
    def _touch(rt: DeviceRuntime) -> None:
        rt.last_seen = datetime.now(UTC)

