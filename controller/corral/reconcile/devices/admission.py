"""Whether a device may be driven at all, and what its Device says when not.

Three gates before any plan: the announced contract is trusted (not held for a person, not refused), the Device is
the one claim on its device id (the oldest wins; the others stay inert), and the Device is one the controller can
read (a Device its model refuses is told so, never driven and never a crash). Apart from the reconciler because
each gate ends in its own Events and status, none of which the drive needs to know.
"""

from __future__ import annotations

import logging

from corral.api.device import Device
from corral.devices.heartbeat import failsafes_too_soon, too_soon_note
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.cache import Refused, key_of_device
from corral.reconcile.devices.notices import DeviceNotices, device_ref
from corral.reconcile.devices.runtime import DeviceRuntime
from corral.reconcile.devices.status import duplicate_status, malformed_status, parse, recorded, serialize
from corral.reconcile.devices.trust import ContractTrust
from corral.reconcile.devices.writes import StatusWriter, now

log = logging.getLogger(__name__)


class Admission:
    def __init__(self, config: ControllerConfig, kube: Kube, trust: ContractTrust, notices: DeviceNotices,
                 recorder: EventRecorder, writer: StatusWriter) -> None:
        self.config = config
        self.kube = kube
        self.trust = trust
        self.notices = notices
        self.recorder = recorder
        self.writer = writer
        self._announced: set[str] = set()  # duplicate and malformed Devices told, by uid (and generation)

    async def trusted(self, rt: DeviceRuntime, device: Device) -> bool:
        """Judge the announced contract against the accepted one; False when the device is held (or its contract
        refused) and nothing may be driven: its status says why."""
        assert rt.contract is not None and rt.capability is not None
        was_held = bool(rt.hold)
        refused = self.trust.judge(rt, device)
        if refused is not None:
            rt.contract, rt.contract_error = None, refused
            self.notices.once(rt, device, f"contract-refused/{rt.capability}", "ContractRefused", "Refuse",
                              f"The device's contract was refused: {refused}", "Warning",
                              fact=("contract.refused", {"capability": rt.capability, "why": refused}))
            await self.writer.write(rt, device, self.writer.status(rt, device, None), "contract")
            return False
        if not rt.hold:
            # Only an accepted contract gets a Capability (a held one is named in status.capability and waits);
            # made again if it was deleted while the Device trusts it.
            await self.trust.capabilities.ensure(rt.capability, rt.contract, rt.device_id)
        if not rt.capability_ensured and not rt.hold:
            self._in_force(rt, device)
        if rt.hold:
            # One Event and record per accepted contract while held, not per announcement: a device re-announcing
            # changed contracts cannot flood them (each change is on record as contract.changed; the condition
            # always names the latest).
            what = (f"The device announced a contract (Capability {rt.capability}) that asks for more trust than "
                    f"the accepted one ({rt.accepted_capability})" if rt.accepted_capability is not None else
                    f"The bridge announced a contract (Capability {rt.capability}) for this bridged device")
            self.notices.once(rt, device, f"hold/{rt.accepted_capability}", "ContractHeld", "Hold",
                              f"{what}: {'; '.join(rt.hold)}. Nothing is sent to it and its Intents wait until a "
                              f"person accepts it (corral devices accept-contract {device.metadata.name}).", "Warning",
                              fact=("contract.held", {"capability": rt.capability, "accepted": rt.accepted_capability,
                                                      "why": list(rt.hold)}))
            await self.writer.write(rt, device, self.writer.status(rt, device, None), "hold")
            return False
        if was_held:
            self.notices.fact("contract.accepted", device, {"capability": rt.capability, "by": "spec.acceptCapability"})
            self.notices.post(device, "ContractAccepted", "Accept",
                              f"Capability {rt.capability} accepted (spec.acceptCapability); the device is driven again.")
        return True

    def _in_force(self, rt: DeviceRuntime, device: Device) -> None:
        """The contract is in force (its Capability exists): on record once per run, and a warning when its
        failsafes would trip on one lost heartbeat."""
        assert rt.contract is not None
        rt.capability_ensured = True
        if f"contract/{rt.capability}" not in rt.announced:
            rt.announced.add(f"contract/{rt.capability}")  # once per controller run
            self.notices.fact("contract.in_force", device, {"capability": rt.capability,
                                                            "version": rt.contract.version})
        too_soon = failsafes_too_soon(rt.contract, self.config.heartbeat_interval_s)
        if too_soon:
            note = too_soon_note(too_soon, self.config.heartbeat_interval_s)
            log.warning("device %s: %s", rt.device_id, note)
            self.notices.once(rt, device, f"failsafe-too-soon/{rt.capability}", "FailsafeTooSoon", "Observe",
                              note, "Warning")

    async def refuse_duplicate(self, device: Device, winner: Device) -> None:
        owner = "/".join(key_of_device(winner))
        message = (f"device {device.spec.device_id} is already bound to Device {owner} (the oldest claim wins); "
                   "this Device stays inert until that one is deleted or its deviceId changes")
        await self.writer.write(None, device, duplicate_status(recorded(device), device.metadata.generation, message,
                                                               now()), "duplicate")
        key = f"duplicate/{device.metadata.uid}"
        if key not in self._announced:
            self._announced.add(key)
            self.notices.post(device, "DuplicateDeviceId", "Refuse", message, "Warning")

    async def refuse_malformed(self, refused: Refused) -> None:
        """A Device its model refuses: condition Ready=False (Malformed) and a Warning Event, once per generation.
        It is not driven (nothing acts on a version the controller cannot read) until a person mends it."""
        key = f"malformed/{refused.uid}/{refused.generation}"
        if key in self._announced:
            return
        message = f"{refused.error}. It is not driven until it is mended."
        namespace, name = refused.key
        previous = parse(refused.body.get("status"))  # what of it can be read; the rest is written anew
        status = malformed_status(previous, refused.generation, message, now())
        await self.kube.apply_status("devices", namespace, name, "Device", serialize(status), "malformed")
        self._announced.add(key)
        self.recorder.post(device_ref(refused.body), "Malformed", "Refuse", message, "Warning")
