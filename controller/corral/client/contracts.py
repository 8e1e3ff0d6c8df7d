"""A person accepting a Device's changed contract: `spec.acceptCapability` set to the Capability it announces.

The controller puts a Device on hold when its contract asks for more trust than the accepted one (lower
risk, a new actuator, a wider range, a changed action or failsafe); nothing is driven and Intents on it
wait. Accepting names the exact Capability the person looked at, so a contract that changes again in
between is not accepted by accident. The API server's admission policy lets only someone with the
`approve` verb on the Device change the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import kubernetes

from corral.api.codes import GROUP, VERSION

FIELD_MANAGER = "corral-accept-contract"


class AcceptError(Exception):
    """Why there is nothing to accept, said so that a person knows what to do."""


@dataclass(frozen=True)
class Held:
    announced: str  # the Capability the device announces (status.capability)
    accepted: str | None  # the one it is trusted with (status.acceptedCapability)
    reasons: str  # the ContractAccepted condition's message


def held(device: dict[str, Any]) -> Held | None:
    """What the Device waits for a person to accept, or None when it is not held."""
    status = device.get("status") or {}
    condition = next((c for c in status.get("conditions") or [] if c.get("type") == "ContractAccepted"), None)
    announced = status.get("capability")
    if condition is None or condition.get("status") != "False" or not announced:
        return None
    return Held(announced, status.get("acceptedCapability"), str(condition.get("message") or ""))


def accept(api_client: kubernetes.client.ApiClient, namespace: str, name: str,
           capability: str | None = None) -> Held:
    """Accept what Device `name` announces (`capability`, if given, must be that Capability)."""
    objects = kubernetes.client.CustomObjectsApi(api_client)
    try:
        device = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "devices", name)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            raise AcceptError(f"no Device {name} in {namespace}") from None
        raise
    waiting = held(device)
    if waiting is None:
        status = device.get("status") or {}
        raise AcceptError(f"Device {name} is not held: it is trusted with the contract it announces "
                          f"({status.get('acceptedCapability') or status.get('capability') or 'none yet'})")
    if capability is not None and capability != waiting.announced:
        raise AcceptError(f"Device {name} now announces Capability {waiting.announced}, not {capability}: read what "
                          f"changed (its ContractAccepted condition: kubectl describe device {name}) and accept that "
                          "one (the Capability itself is made once it is accepted)")
    patch = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": name},
             "spec": {"acceptCapability": waiting.announced}}
    objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, "devices", name, patch,
                                           field_manager=FIELD_MANAGER, force=True,
                                           _content_type="application/apply-patch+yaml")
    return waiting
