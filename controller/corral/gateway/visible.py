"""A Device as one caller may see it: what its levels let it read, in the shape the tools return.

Pure: built from the Device object (as the watch delivers it), the contract of
its Capability and the caller's levels. `read` shows the device, its state and
its contract; `listen` adds sensor readings. Nothing here names a device the
caller cannot read: the view is only built for devices that passed `levels()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from corral.contract.model import Actuator, Contract
from corral.contract.text import bounded
from corral.contract.values import allowed


def device_uri(namespace: str, name: str) -> str:
    return f"corral://devices/{namespace}/{name}"


INDEX_URI = "corral://devices"


@dataclass(frozen=True)
class VisibleDevice:
    namespace: str
    name: str
    body: dict[str, Any]  # the Device as the API server returned it
    contract: Contract | None
    levels: frozenset[str]

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def uri(self) -> str:
        return device_uri(self.namespace, self.name)

    @property
    def status(self) -> dict[str, Any]:
        return self.body.get("status") or {}

    @property
    def online(self) -> bool:
        return bool(self.status.get("online"))

    @property
    def overlay(self) -> dict[str, str]:
        """Alias, location and notes, made safe here too: anyone with `patch` on the Device writes them directly,
        and the API server refuses only control characters, not bidi or tag characters."""
        overlay = (self.body.get("spec") or {}).get("overlay") or {}
        return {k: bounded(v, OVERLAY_LIMIT) for k, v in overlay.items() if isinstance(v, str) and v}

    @property
    def bridged_from(self) -> str | None:
        """The source a bridged device speaks through (spec.bridge.source, a person's name for it), or None."""
        bridge = (self.body.get("spec") or {}).get("bridge")
        source = bridge.get("source") if isinstance(bridge, dict) else None
        return bounded(source, 63) if isinstance(source, str) and source else None

    def usable_actuators(self) -> list[Actuator]:
        """Actuators whose level the caller holds."""
        if self.contract is None:
            return []
        return [a for a in self.contract.actuators if a.level in self.levels]

    def summary(self) -> dict[str, Any]:
        """One line of the device list."""
        contract = self.contract
        return {
            "device_id": self.id,
            "name": contract.name if contract else None,
            "model": contract.model if contract else None,
            "alias": self.overlay.get("alias", ""),
            "location": self.overlay.get("location", ""),
            "online": self.online,
            "in_sync": self.status.get("inSync"),
            "actuators": [a.id for a in self.usable_actuators()],
            "sensors": [s.metric for s in contract.sensors] if contract and "listen" in self.levels else [],
            **({"bridged_from": self.bridged_from} if self.bridged_from else {}),
        }

    def detail(self, now: datetime) -> dict[str, Any]:
        """Everything iot.query returns for one device."""
        status, contract = self.status, self.contract
        sensors: dict[str, Any] = {}
        if "listen" in self.levels:
            for metric, reading in (status.get("sensors") or {}).items():
                ts = _epoch_ms(reading.get("timestamp"))
                sensors[metric] = {
                    "value": reading.get("value"),
                    "unit": reading.get("unit", ""),
                    "ts": ts,
                    "age_s": round((now.timestamp() * 1000 - ts) / 1000, 1) if ts is not None else None,
                }
        conditions = [
            {"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason"),
             "message": _said(c.get("message"))}
            for c in status.get("conditions") or []
        ]
        # The safety rules guarding the device's actions (a guarded action is DENY_INTERLOCK while its condition
        # does not hold), and any target one of them keeps from being driven.
        interlocks = [
            {"name": i.get("name"), "actuators": i.get("actuators") or [], "condition": i.get("condition"),
             "message": _said(i.get("message")), "compiled": i.get("compiled")}
            for i in status.get("interlocks") or []
        ]
        held = [
            {"actuator": h.get("actuator"), "value": h.get("value"), "interlock": h.get("interlock"),
             "message": _said(h.get("message"))}
            for h in status.get("interlockedTargets") or []
        ]
        return {
            **self.summary(),
            "notes": self.overlay.get("notes", ""),
            "stale": bool(status.get("stale")),
            "last_seen": status.get("lastSeen"),
            "reported": status.get("reported") or {},
            "target": (self.body.get("spec") or {}).get("target") or {},
            "sensors": sensors,
            "actions": [action_of(a) for a in self.usable_actuators()],
            "conditions": conditions,
            "interlocks": interlocks,
            "interlocked_targets": held,
            **({"bridge": {"source": self.bridged_from, "note": BRIDGED_NOTE}} if self.bridged_from else {}),
            "contract": (
                {"name": contract.name, "model": contract.model, "fw": contract.fw,
                 "capability": status.get("acceptedCapability") or status.get("capability")}
                if contract else None
            ),
        }


@dataclass(frozen=True)
class Grants:
    """What the caller may do beyond reading, per namespace."""

    create_intents: frozenset[str]  # namespaces

    def controllable(self, device: VisibleDevice) -> list[Actuator]:
        if device.namespace not in self.create_intents:
            return []
        return device.usable_actuators()


def action_of(actuator: Actuator) -> dict[str, Any]:
    return {
        "actuator": actuator.id,
        "name": actuator.name,
        "action": actuator.action,
        "params": {"type": "object", "properties": {"value": value_schema(actuator)}, "required": ["value"]},
        "allowed": allowed(actuator),
        "risk": actuator.risk,
        "level": actuator.level,
        "description": actuator.description,
        # What the device does by itself when it stops hearing the controller: an agent planning around an
        # outage (or wondering why a heater went off) needs it.
        **({"failsafe": {"value": actuator.failsafe.value, "delay_s": actuator.failsafe.delay_s}}
           if actuator.failsafe is not None else {}),
        # Its hardware on-time limit (the firmware switches it off after that long) and whether a request must carry
        # hold_for_s: without them an agent learns of the limit only from a refusal.
        **({"max_on_s": actuator.max_on_seconds} if actuator.max_on_seconds is not None else {}),
        **({"hold_required": True} if actuator.hold_required else {}),
    }


def value_schema(actuator: Actuator) -> dict[str, Any]:
    """JSON Schema of an actuator's target value, exactly as its contract allows."""
    text = allowed(actuator)
    if actuator.type == "bool":
        return {"type": "boolean", "description": text}
    if actuator.type == "enum":
        return {"type": "string", "enum": list(actuator.values or []), "description": text}
    if actuator.type == "color":
        return {"type": "string", "pattern": "^#[0-9a-f]{6}$", "description": text}
    assert actuator.range is not None
    bounds = {"minimum": actuator.range.min, "maximum": actuator.range.max}
    if actuator.type == "counter":
        return {"type": "integer", **{k: int(v) for k, v in bounds.items()}, "description": text}
    return {"type": "number", **bounds, "description": text}


# What an agent must know of a bridged device (docs/bridge.md): no firmware of ours clamps or acks there.
BRIDGED_NOTE = ("A bridged device (a third-party device spoken for by corral bridge): it has no device-side clamp; the "
                "bridge validates and clamps every command, publishes it once, and the outcome is the device's next "
                "state report showing the value (else the Intent fails saying the device did not confirm).")

OVERLAY_LIMIT = 512  # the API server's own limit for notes; alias and location are held to 64 there


def _said(message: Any) -> Any:
    """A condition's or rule's message: it may quote a device or a person (a contract hold's reasons do)."""
    return bounded(message, 1024) if isinstance(message, str) else message


def _epoch_ms(timestamp: str | None) -> int | None:
    if not timestamp:
        return None
    try:
        return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None
