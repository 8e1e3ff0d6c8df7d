"""What devices say over MQTT, taken in: parsed, checked, recorded in the runtime, and queued.

The MQTT link hands every message over on the event loop (`call_soon_threadsafe`). Nothing here waits:
a message updates what the controller knows about its device and, when that deserves a reconcile,
queues the device id. Every payload is untrusted (`devices.messages` parses and bounds it); a bad one
is logged, and a bad contract makes the device inert until it announces a good one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from corral.api.capability import capability_name
from corral.contract.diff import contract_diff
from corral.contract.signature import verify
from corral.devices import messages
from corral.devices.link import Inbound
from corral.devices.telemetry import Coalescing
from corral.devices.topics import Topics
from corral.obs import metrics
from corral.reconcile.driver import Driver
from corral.reconcile.notices import DeviceNotices
from corral.reconcile.runtime import DeviceRuntime, Fleet
from corral.reconcile.status import sensors_due
from corral.reconcile.workqueue import WorkQueue

log = logging.getLogger(__name__)


class Ingest:
    def __init__(self, topics: Topics, fleet: Fleet, queue: WorkQueue[str], driver: Driver, notices: DeviceNotices,
                 coalescing: Coalescing, require_signatures: bool = False,
                 signing_keys: Mapping[str, Ed25519PublicKey] | None = None) -> None:
        self.topics = topics
        self.fleet = fleet
        self.queue = queue
        self.driver = driver
        self.notices = notices
        self.coalescing = coalescing
        self.require_signatures = require_signatures
        self.signing_keys = dict(signing_keys or {})
        self.link_up_since = 0.0

    def on_message(self, message: Inbound) -> None:
        parsed = self.topics.parse(message.topic)
        if parsed is None:
            return
        device_id, kind = parsed
        rt = self.fleet.get(device_id)
        if rt is None:
            if kind == "status":
                # MQTT orders messages per topic only: the status may come before the contract.
                self.fleet.keep_status(device_id, message.payload)
            if kind != "info":
                return  # devices become known through their contract
            rt = self.fleet.add(device_id)
            metrics.device_online_changed(None, rt.online, new=True)
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
            if self.require_signatures:
                check = verify(contract, self.signing_keys)
                if check.outcome != "valid":
                    raise messages.BadMessage(f"contract signature {check.outcome}: {check.detail}")
        finally:
            pending = self.fleet.take_status(rt.device_id) if first else None
            if pending is not None:
                self._status_of_new_device(rt, pending)
        previous = rt.contract
        rt.contract, rt.contract_error = contract, None
        rt.capability = capability_name(contract)
        rt.capability_ensured = (rt.capability_ensured and previous is not None
                                 and rt.capability == capability_name(previous))
        rt.registration_suppressed = False
        self._touch(rt)
        if previous is not None and capability_name(previous) != rt.capability:
            changes = contract_diff(previous, contract)
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
        if online != rt.online:
            metrics.device_online_changed(rt.online, online)
            rt.online = online
            rt.state_known = False  # a device that was away may have restarted with other state
            rt.failures, rt.next_attempt = 0, 0.0
        self._touch(rt)
        self.queue.add(rt.device_id)

    def _on_ack(self, rt: DeviceRuntime, payload: bytes) -> None:
        ack = messages.parse_ack(payload)
        self._touch(rt)
        self.driver.on_ack(rt.device_id, ack)

    def _on_telemetry(self, rt: DeviceRuntime, payload: bytes) -> None:
        telemetry = messages.parse_telemetry(payload)
        self._touch(rt)
        for sample in telemetry.samples:
            rt.buffer.add(sample)
        sensors = {s.metric: s for s in rt.contract.sensors} if rt.contract else {}
        if sensors_due(rt.memory, rt.buffer.latest, sensors, self.coalescing, time.monotonic()):
            self.queue.add(rt.device_id)

    def _on_event(self, rt: DeviceRuntime, payload: bytes) -> None:
        event = messages.parse_event(payload)
        self._touch(rt)
        if event.state is not None:
            # The device reports its whole state after a local change or a restart.
            changed = rt.report(dict(event.state))
            self.notices.state_changed(rt, changed, f"the device reported its state ({event.event})")
            self.queue.add(rt.device_id)

    @staticmethod
    def _touch(rt: DeviceRuntime) -> None:
        rt.last_seen = datetime.now(UTC)
