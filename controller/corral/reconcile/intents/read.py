"""The read Intent: answered from the device itself, its state now and its latest sensor readings.

A read sets no target and sends no command that changes anything: it asks the device for its state
(get_state) and ends with what it said, or with what the controller received last for a sensor.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from corral.contract.values import shown
from corral.decide.decision import Decision, DeviceFacts, IntentFacts
from corral.kube.cache import Key
from corral.kube.workqueue import Result
from corral.reconcile.devices.port import DevicePort, DeviceView
from corral.reconcile.intents.facts import StoredIntent, namespace_of
from corral.reconcile.intents.outcomes import Outcomes


class Read:
    interlocked = False

    def __init__(self, outcomes: Outcomes, devices: DevicePort) -> None:
        self.outcomes = outcomes
        self.devices = devices

    def verb(self, facts: IntentFacts, device: DeviceFacts) -> str | None:
        return "read" if device.contract is not None else None

    def doing(self, intent: StoredIntent, decision: Decision) -> str:
        return f"read {intent.spec.actuator} from the device"

    async def act(self, key: Key, intent: StoredIntent, view: DeviceView | None, decision: Decision,
                  base: dict[str, Any]) -> Result:
        """Answer from the device itself: its state now, and its latest sensor readings."""
        assert view is not None and view.device_id is not None
        try:
            state = await self.devices.read_state(view.device_id)
        except TimeoutError:
            return await self.outcomes.finish(intent, view, "TIMEOUT", "The device did not answer the read in time.",
                                              base)
        fresh = self.devices.view(namespace_of(intent), intent.spec.device) or view
        readings = {metric: sample.value for metric, sample in fresh.latest.items()}
        item = intent.spec.actuator
        if item in state:
            found = f"{item}={shown(state[item])}, read from the device just now"
        else:
            sample = fresh.latest.get(item)
            age = (datetime.now(UTC).timestamp() * 1000 - sample.received_ms) / 1000 if sample else None
            found = f"{item}={shown(sample.value)}, received {age:.1f} s ago" if sample else f"{item}: no reading yet"
        return await self.outcomes.finish(intent, fresh, "EXECUTED", f"Read {found}.",
                                          {**base, "after": {**readings, **state}})
