"""Which tools one caller sees: exposure first, then tools (Home Assistant's llm helpers have the same shape).

A tool exists for a caller only when the caller could use it; each is one object of `tools/` (its schema and
what it does, together). The catalog of a caller is derived from its view and kept in the view's memo, which
the view clears whenever what the caller sees changes.

- `iot.list_devices`, `iot.query`, `iot.intent_status`: any visible device.
- `iot.read`: a visible device whose samples the caller may `listen` to.
- `iot.control`: a visible actuator whose level (write/config) the caller holds,
  and the right to create Intents there (`dry_run` checks without executing).
- `iot.acquire`, `iot.release`: the same devices as iot.control.
- `iot.set_alias|set_note|set_location`: the `annotate` verb on a visible Device and the right to
  create Intents there (the overlay is set by an Intent too; no agent needs `patch`).
- `iot.rules.list|get`: `get` and `list` on rules in a served namespace; `iot.rules.put|restore`: `create` and
  `update` there too (the admission policy decides the rest: api/policies.py). They need no visible device.
- `{device}.{actuator}.{action}` (optional, `--device-tools`): one tool per
  usable actuator of an online device, its value schema straight from the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.contract.model import Actuator
from corral.gateway.tools.base import Tool
from corral.gateway.tools.control import Control, DeviceTool
from corral.gateway.tools.lease import Acquire, Release
from corral.gateway.tools.overlay import OVERLAY_TOOLS, SetOverlay
from corral.gateway.tools.read import ListDevices, Query, ReadSamples
from corral.gateway.tools.rules import rule_tools
from corral.gateway.tools.schemas import device_id_schema
from corral.gateway.tools.status import IntentStatus
from corral.gateway.view import CallerView
from corral.gateway.visible import Grants, VisibleDevice

__all__ = ["Catalog", "Grants", "catalog", "device_tools", "fixed_tools"]


def fixed(devices: list[VisibleDevice], grants: Grants, annotatable: list[VisibleDevice]) -> list[Tool]:
    """The fixed tools the caller may use; none at all when it can see no device."""
    if not devices:
        return []
    tools: list[Tool] = [ListDevices(), Query(devices), IntentStatus()]
    listenable = [d for d in devices if "listen" in d.levels]
    if listenable:
        tools.append(ReadSamples(listenable))
    controllable = [d for d in devices if grants.controllable(d)]
    if controllable:
        device_id = device_id_schema(controllable)
        tools += [Control(controllable, grants), Acquire(device_id), Release(device_id)]
    annotatable = [d for d in annotatable if d.namespace in grants.create_intents]
    if annotatable:
        tools += [SetOverlay(name, annotatable) for name in OVERLAY_TOOLS]
    return tools


def device_tool_name(device: VisibleDevice, actuator: Actuator, qualify: bool) -> str:
    prefix = f"{device.namespace}.{device.name}" if qualify else device.name
    return f"{prefix}.{actuator.id}.{actuator.action}"


def per_device(devices: list[VisibleDevice], grants: Grants) -> dict[str, DeviceTool]:
    """Per-device tools by name, for online devices only: an offline device cannot act."""
    names = [d.name for d in devices]
    out: dict[str, DeviceTool] = {}
    for device in devices:
        if not device.online:
            continue
        qualify = names.count(device.name) > 1
        for actuator in grants.controllable(device):
            name = device_tool_name(device, actuator, qualify)
            out[name] = DeviceTool(name, device, actuator)
    return out


def fixed_tools(devices: list[VisibleDevice], grants: Grants, annotatable: list[VisibleDevice]) -> list[dict[str, Any]]:
    """The fixed tools' definitions (as tools/list shows them)."""
    return [tool.definition() for tool in fixed(devices, grants, annotatable)]


def device_tools(devices: list[VisibleDevice], grants: Grants
                 ) -> dict[str, tuple[VisibleDevice, Actuator, dict[str, Any]]]:
    """The per-device tools as (device, actuator, definition) by name."""
    return {name: (tool.device, tool.actuator, tool.definition()) for name, tool in per_device(devices, grants).items()}


@dataclass(frozen=True)
class Catalog:
    """One caller's tools: what tools/list shows (`listed`, in order), and the per-device tools by name (callable
    whether listed or not; listed only with `--device-tools`)."""

    listed: dict[str, Tool]
    device: dict[str, DeviceTool]

    def definitions(self) -> list[dict[str, Any]]:
        return [tool.definition() for tool in self.listed.values()]

    def find(self, name: str) -> Tool | None:
        return self.listed.get(name) or self.device.get(name)


def catalog(view: CallerView) -> Catalog:
    """The caller's tools, built again only after a change of what it sees (the view clears its memo then)."""
    found = view.memo.get("catalog")
    if isinstance(found, Catalog):
        return found
    devices, grants = view.visible(), view.grants()
    device = per_device(devices, grants)
    listed: list[Tool] = [*fixed(devices, grants, view.annotatable()), *rule_tools(view),
                          *(device.values() if view.device_tools_on else ())]
    made = view.memo["catalog"] = Catalog({tool.name: tool for tool in listed}, device)
    return made
