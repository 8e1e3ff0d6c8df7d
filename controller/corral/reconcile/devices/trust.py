"""Judging a device's announced contract against what its Device accepted (contract.trust), with the facts
the controller holds: the Device's status and spec, the Capabilities, the risk floors of its configuration."""

from __future__ import annotations

from corral.api.device import Device
from corral.contract.freshness import DEFAULT_RULE, FreshnessRule
from corral.contract.model import Contract
from corral.contract.trust import RiskFloors, judge, with_floors
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.capabilities import Capabilities
from corral.reconcile.devices.runtime import DeviceRuntime


class ContractTrust:
    def __init__(self, capabilities: Capabilities, devices: DeviceCache, floors: RiskFloors,
                 check_versions: bool, freshness: FreshnessRule = DEFAULT_RULE) -> None:
        self.capabilities = capabilities
        self.devices = devices
        self.floors = floors
        self.check_versions = check_versions
        self.freshness = freshness  # the cluster's freshness rule: what a changed sensor interval is judged by

    def judge(self, rt: DeviceRuntime, device: Device | None = None) -> str | None:
        """Set what the device is trusted with (`rt.accepted_capability`, `rt.hold`) for its announced contract;
        the reason when the contract is refused outright (a replayed older signed contract)."""
        if rt.contract is None or rt.capability is None:
            return None
        device = device or next(iter(self.devices.claims(rt.device_id)), None)
        if device is None:
            return None
        uid = device.metadata.uid
        if rt.accepted_for != uid:
            rt.accepted_for = uid
            # Devices from before contracts were accepted trusted what their status names. Not a bridged one: its
            # status.capability may name a contract held at first binding, which nobody accepted.
            status = device.status
            fallback = status.capability if status is not None and device.spec.bridge is None else None
            rt.accepted_capability = (status.accepted_capability or fallback) if status is not None else None
        accepted = self.capabilities.contract(rt.accepted_capability, rt.device_id)
        bridge = device.spec.bridge
        verdict = judge(rt.contract, rt.capability, accepted, rt.accepted_capability, device.spec.accept_capability,
                        self.check_versions, self.freshness,
                        bridged_hash=bridge.accepted_contract_hash if bridge is not None else None)
        if verdict.refused is not None:
            return verdict.refused
        rt.accepted_capability, rt.hold, rt.hold_reason = verdict.accepted, verdict.hold, verdict.hold_reason
        return None

    def bridged(self, device_id: str) -> bool:
        """Whether the Device that binds this id is bridged (spec.bridge, set by a person): its contract comes from
        the bridge, unsigned, and signatures are not asked of it. Only spec.bridge says so; whatever a contract
        claims about itself, a Device without it is native."""
        device = next(iter(self.devices.claims(device_id)), None)
        return device is not None and device.spec.bridge is not None

    def effective(self, contract: Contract, device: Device) -> Contract:
        """The contract with the cluster's risk floors applied: what decisions judge by."""
        return with_floors(contract, self.floors, device.metadata.namespace or "", device.metadata.name or "")
