"""Setting a Device's target for an Intent, without undoing another Intent's.

Server-side apply replaces the whole set of fields a manager owns: an apply by `corral-intents` must
repeat every target field that earlier Intents set, or the API server removes them. That set is read
from the Device, and the Device the controller holds may be a moment old. So every apply carries the
resourceVersion it was computed from as a precondition: if the Device changed since, the API server
refuses (409), the controller reads the Device from the API server and computes again. A field that
another manager (a person's `kubectl apply`) owns is a FieldConflict and is never taken over.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from corral.api.codes import INTENTS_MANAGER
from corral.reconcile.kube import StaleVersion

log = logging.getLogger(__name__)

Body = dict[str, Any]
ATTEMPTS = 8


def owned_target(device: Body, manager: str = INTENTS_MANAGER) -> dict[str, Any]:
    """Target entries this field manager applied before: a new apply must repeat them, or they are removed."""
    target = (device.get("spec") or {}).get("target") or {}
    owned: dict[str, Any] = {}
    for entry in device["metadata"].get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        fields = ((entry.get("fieldsV1") or {}).get("f:spec") or {}).get("f:target") or {}
        for name in fields:
            key = name.removeprefix("f:")
            if name.startswith("f:") and key in target:
                owned[key] = target[key]
    return owned


def intent_target(device: Body, actuator: str, value: Any) -> dict[str, Any]:
    """The whole `corral-intents` target after this Intent: what earlier Intents set, and this value."""
    return {**owned_target(device), actuator: value}


class TargetApi(Protocol):
    async def apply_intent_target(self, namespace: str, device: str, target: dict[str, Any], intent: str,
                                  resource_version: str) -> Body: ...

    async def get_device(self, namespace: str, name: str) -> Body: ...


class TargetApplier:
    def __init__(self, api: TargetApi, attempts: int = ATTEMPTS) -> None:
        self.api = api
        self.attempts = attempts
        self.stale = 0  # applies refused as computed from an old version, for tests and benchmarks

    async def apply(self, device: Body, actuator: str, value: Any, intent: str) -> Body:
        """Set target[actuator] = value on the Device, keeping every other `corral-intents` field.

        `device` is the latest copy the caller has; it may be stale. Returns the Device as written.
        Raises FieldConflict when another manager owns the field, StaleVersion when the Device kept
        changing under every attempt.
        """
        meta = device["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        latest = device
        for attempt in range(1, self.attempts + 1):
            target = intent_target(latest, actuator, value)
            try:
                written = await self.api.apply_intent_target(namespace, name, target, intent,
                                                             latest["metadata"]["resourceVersion"])
            except StaleVersion:
                self.stale += 1
                log.debug("target apply for %s on %s/%s: version %s is stale (attempt %d); reading again",
                          intent, namespace, name, latest["metadata"]["resourceVersion"], attempt)
                latest = await self.api.get_device(namespace, name)
                continue
            return written
        raise StaleVersion(f"Device {namespace}/{name} changed under each of {self.attempts} attempts to set "
                           f"spec.target.{actuator}")
