"""The actuating Intent: a contract action (set_state, set_value, ...) that sets a Device's target.

Deciding it is the same as for every kind; carrying it out is not done here but handed to the execution
reconciler (execute.py), whose queue holds one key per Device, so that one Device's Intents run one at a time.
Interlocks judge it, and its requester needs the permission level the actuator's contract names.
"""

from __future__ import annotations

from typing import Any

from corral.contract.values import shown
from corral.decide.decision import Decision, DeviceFacts, IntentFacts
from corral.kube.cache import Key
from corral.kube.workqueue import Result
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.intents.execute import Handovers
from corral.reconcile.intents.facts import StoredIntent


class Actuate:
    interlocked = True

    def __init__(self, handovers: Handovers) -> None:
        self.handovers = handovers

    def verb(self, facts: IntentFacts, device: DeviceFacts) -> str | None:
        actuator = device.contract.actuator(facts.actuator) if device.contract is not None else None
        return actuator.level if actuator is not None else None

    def doing(self, intent: StoredIntent, decision: Decision) -> str:
        spec = intent.spec
        return f"{spec.action} {spec.actuator}={shown(decision.value)} on {spec.device}"

    async def act(self, key: Key, intent: StoredIntent, view: DeviceView | None, decision: Decision,
                  base: dict[str, Any]) -> Result:
        self.handovers.hand_over(key, intent, decision)
        return Result.done()
