"""The four kinds of Intent, and which one an action is: one object per kind, found in a table, not by if-chains.

An Intent acts on a device's target (actuate: set_state, set_value and the other contract actions), reads a
device (read), sets the overlay people see (overlay: set_alias, set_note, set_location) or takes, gives back or
breaks a lease (lease: acquire, release, break). Each kind says which RBAC verb its requester needs, whether
interlocks judge it, what it would do (for a dry run), and how it is carried out once `decide` let it through.
Everything else (gathering, deciding, recording) is the same for all four.
"""

from __future__ import annotations

from typing import Any, Protocol

from corral.api.intent import LEASE_ACTIONS, OVERLAY_ACTIONS
from corral.decide.decision import Decision, DeviceFacts, IntentFacts
from corral.kube.cache import Key
from corral.kube.workqueue import Result
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.intents.facts import StoredIntent


class IntentKind(Protocol):
    """What differs between the kinds of Intent."""

    @property
    def interlocked(self) -> bool:
        """Whether interlocks judge it (it sets a device's target)."""
        ...

    def verb(self, facts: IntentFacts, device: DeviceFacts) -> str | None:
        """The verb on devices/NAME its requester needs; None: nobody may (the device's contract has no such
        actuator)."""
        ...

    def doing(self, intent: StoredIntent, decision: Decision) -> str:
        """What it would do, in words, for a dry run's answer."""
        ...

    async def act(self, key: Key, intent: StoredIntent, view: DeviceView | None, decision: Decision,
                  base: dict[str, Any]) -> Result:
        """Carry it out, now that `decide` let it through; `base` is the status every outcome carries."""
        ...


class Kinds:
    """Which kind each action is: read, the overlay actions and the lease actions by name; any other is a
    contract action, which actuates."""

    def __init__(self, actuate: IntentKind, read: IntentKind, overlay: IntentKind, lease: IntentKind) -> None:
        self.actuate = actuate
        self._by_action: dict[str, IntentKind] = {
            "read": read, **dict.fromkeys(OVERLAY_ACTIONS, overlay), **dict.fromkeys(LEASE_ACTIONS, lease)}

    def of(self, action: str) -> IntentKind:
        return self._by_action.get(action, self.actuate)
