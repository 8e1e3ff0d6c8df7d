"""The lease Intent: exclusive control of a Device, taken, given back or broken through the same pipeline.

Only the controller writes the Lease objects (reconcile/guards/leases.py). The decision said whether the
requester may; here the Lease is written, each change noted in the audit log, and the Intent ended with what
happened (or DENY_LEASED when someone else took it in between).
"""

from __future__ import annotations

from typing import Any

from corral.audit.log import AuditLog
from corral.contract.values import shown
from corral.decide.decision import Decision, DeviceFacts, IntentFacts, lease_verb
from corral.kube.cache import Key
from corral.kube.client import ApiError
from corral.kube.workqueue import Result
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.guards.leases import Leases, LeaseTaken
from corral.reconcile.intents.facts import StoredIntent, name_of, namespace_of
from corral.reconcile.intents.outcomes import Outcomes


class Lease:
    interlocked = False

    def __init__(self, outcomes: Outcomes, leases: Leases | None, audit: AuditLog) -> None:
        self.outcomes = outcomes
        self.leases = leases  # None: this controller keeps no leases
        self.audit = audit

    def verb(self, facts: IntentFacts, device: DeviceFacts) -> str | None:
        return lease_verb(facts.action)

    def doing(self, intent: StoredIntent, decision: Decision) -> str:
        spec = intent.spec
        return f"{spec.action} {spec.actuator}={shown(decision.value)} on {spec.device}"

    async def act(self, key: Key, intent: StoredIntent, view: DeviceView | None, decision: Decision,
                  base: dict[str, Any]) -> Result:
        """Take, give back or break the Device's lease, as the checks allowed: the controller writes the Lease."""
        if self.leases is None:
            return await self.outcomes.finish(intent, view, "FAILED", "This controller keeps no leases.", base)
        try:
            message = await self._change(self.leases, intent, decision)
        except LeaseTaken as taken:
            return await self.outcomes.finish(intent, view, "DENY_LEASED", str(taken), base)
        except ApiError as err:
            return await self.outcomes.finish(intent, view, "FAILED", f"The Lease could not be written: {err.status} "
                                                                      f"{err.message}", base)
        return await self.outcomes.finish(intent, view, "EXECUTED", message, base)

    async def _change(self, leases: Leases, intent: StoredIntent, decision: Decision) -> str:
        """Write the Lease and note it in the audit log; what happened, in words."""
        spec, namespace = intent.spec, namespace_of(intent)
        device, who, holder_id, subject = spec.device, spec.requester, spec.holder_id, f"{namespace_of(intent)}/{spec.device}"
        if spec.action == "acquire":
            assert isinstance(decision.value, int)
            lease = await leases.acquire(namespace, device, who, holder_id, decision.value, spec.reason)
            self.audit.note("lease.acquired", subject, {
                "holder": who, "holderId": holder_id, "ttlSeconds": decision.value, "reason": spec.reason,
                "intent": name_of(intent)})
            return (f"Device {device} is leased to {lease.who()} until {lease.expires_at:%H:%M:%S} UTC; every "
                    f"call of yours renews it, and it ends after {decision.value} s without one.")
        if spec.action == "release":
            await leases.release(namespace, device, who, holder_id)
            self.audit.note("lease.released", subject, {"holder": who, "holderId": holder_id,
                                                        "intent": name_of(intent)})
            return f"The lease of Device {device} is given back."
        broken = await leases.break_(namespace, device, who, spec.reason)
        if broken is None:
            return f"Device {device} has no lease; nothing to break."
        self.audit.note("lease.broken", subject, {
            "holder": broken.holder, "holderId": broken.holder_id, "by": who, "reason": spec.reason,
            "intent": name_of(intent)})
        return f"The lease of {broken.who()} on Device {device} is broken: {spec.reason}"
