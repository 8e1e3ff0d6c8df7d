"""The overlay Intent: what people call a Device, where it is and notes about it, set on the Device object.

The overlay never reaches the device. The controller writes the one field, as the checks made it safe, with
a merge patch under the field manager corral-overlay, and ends the Intent with the text before and after. A new
location also brings the Device's `corral.dev/location` label in step at once (reconcile/locations.py), before the
Intent ends: the requester's next call may select the device by where it now is.
"""

from __future__ import annotations

from typing import Any

from corral.api.intent import OVERLAY_ACTIONS, OVERLAY_VERB
from corral.contract.values import shown
from corral.decide.decision import Decision, DeviceFacts, IntentFacts
from corral.kube.cache import Key
from corral.kube.client import ApiError
from corral.kube.objects import Kube
from corral.kube.workqueue import Result
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.intents.facts import StoredIntent, namespace_of
from corral.reconcile.intents.outcomes import Outcomes
from corral.reconcile.locations import LocationLabels


class Overlay:
    interlocked = False

    def __init__(self, outcomes: Outcomes, kube: Kube) -> None:
        self.outcomes = outcomes
        self.kube = kube
        self.locations = LocationLabels(kube)

    def verb(self, facts: IntentFacts, device: DeviceFacts) -> str | None:
        return OVERLAY_VERB

    def doing(self, intent: StoredIntent, decision: Decision) -> str:
        return (f"set the {OVERLAY_ACTIONS[intent.spec.action]} of {intent.spec.device} to "
                f"{shown(decision.value)}")

    async def act(self, key: Key, intent: StoredIntent, view: DeviceView | None, decision: Decision,
                  base: dict[str, Any]) -> Result:
        """The overlay, as the checks made it safe, written by the controller (field manager corral-overlay)."""
        assert view is not None
        spec = intent.spec
        field_name = OVERLAY_ACTIONS[spec.action]
        text = str(decision.value or "")
        before = _overlay(view).get(field_name, "")
        try:
            written = await self.kube.patch_overlay(namespace_of(intent), spec.device, field_name, text)
        except ApiError as err:
            return await self.outcomes.finish(intent, view, "FAILED", f"The overlay could not be written: "
                                                                      f"{err.status} {err.message}", base)
        if field_name == "location":
            # The Device controller would follow too; doing it here means the label is right when the Intent ends.
            metadata = written.get("metadata") or {}
            await self.locations.sync(namespace_of(intent), spec.device, metadata.get("labels"), text)
        what = f"{field_name} {shown(before)} -> {shown(text)}" if text else f"{field_name} {shown(before)} removed"
        return await self.outcomes.finish(intent, view, "EXECUTED", f"Overlay of {spec.device} set: {what}.",
                                          {**base, "before": {field_name: before}, "after": {field_name: text}})


def _overlay(view: DeviceView) -> dict[str, str]:
    """The Device's spec.overlay, field by field."""
    overlay = view.device.spec.overlay if view.device is not None else None
    return overlay.model_dump(by_alias=False) if overlay is not None else {}
