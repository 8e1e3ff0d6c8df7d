"""Judging a device's announced contract against what its Device accepted (contract.trust), with the facts
the controller holds: the Device's status and spec, the Capabilities, the risk floors of its configuration."""

from __future__ import annotations

from corral.contract.freshness import DEFAULT_RULE, FreshnessRule
from corral.contract.model import Contract
from corral.contract.trust import RiskFloors, judge, with_floors
from corral.kube.cache import Body
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

    def judge(self, rt: DeviceRuntime, body: Body | None = None) -> str | None:
        """Set what the device is trusted with (`rt.accepted_capability`, `rt.hold`) for its announced contract;
        the reason when the contract is refused outright (a replayed older signed contract)."""
        if rt.contract is None or rt.capability is None:
            return None
        body = body or next(iter(self.devices.bound(rt.device_id)), None)
        if body is None:
            return None
        uid = body["metadata"].get("uid")
        status, spec = body.get("status") or {}, body.get("spec") or {}
        if rt.accepted_for != uid:
            rt.accepted_for = uid
            # Devices from before contracts were accepted trusted what their status names.
            rt.accepted_capability = status.get("acceptedCapability") or status.get("capability")
        accepted = self.capabilities.contract(rt.accepted_capability, rt.device_id)
        verdict = judge(rt.contract, rt.capability, accepted, rt.accepted_capability, spec.get("acceptCapability"),
                        self.check_versions, self.freshness)
        if verdict.refused is not None:
            return verdict.refused
        rt.accepted_capability, rt.hold, rt.hold_reason = verdict.accepted, verdict.hold, verdict.hold_reason
        return None

    def effective(self, contract: Contract, body: Body) -> Contract:
        """The contract with the cluster's risk floors applied: what decisions judge by."""
        meta = body["metadata"]
        return with_floors(contract, self.floors, meta.get("namespace", ""), meta.get("name", ""))
