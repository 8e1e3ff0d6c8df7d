"""The gateway's resources: the device index and one resource per visible device, and who may follow which.

Answered from the caller's view, like the tools: a device the caller cannot read is not found, the same
answer as for one that does not exist.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from corral.gateway.view import CallerView
from corral.gateway.visible import INDEX_URI

RESOURCE_NOT_FOUND = -32002
TEMPLATE = "corral://devices/{namespace}/{name}"


def listing(view: CallerView) -> types.ListResourcesResult:
    resources = [types.Resource(uri=INDEX_URI, name="devices", title="Devices you can see",
                                mime_type="application/json")]
    # Titled by name: overlay text is data (in the contents), not a label another agent's client shows.
    resources += [types.Resource(uri=d.uri, name=d.id, title=d.name,
                                 mime_type="application/json", description="State, sensors and actions.")
                  for d in view.visible()]
    return types.ListResourcesResult(resources=resources)


def templates() -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
        uri_template=TEMPLATE, name="device", title="One device",
        mime_type="application/json", description="A device's state, sensors and actions, as iot.query gives them.")])


def read(view: CallerView, uri: str) -> types.ReadResourceResult:
    if uri == INDEX_URI:
        data: Any = {"devices": [d.summary() for d in view.visible()]}
    else:
        device = view.find(uri.removeprefix("corral://devices/")) if uri.startswith("corral://devices/") else None
        if device is None or device.uri != uri:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}")
        data = device.detail(view.now())
    return types.ReadResourceResult(contents=[types.TextResourceContents(
        uri=uri, mime_type="application/json", text=json.dumps(data, separators=(",", ":")))])


def may_listen(view: CallerView, uri: str) -> bool:
    if uri == INDEX_URI:
        return True
    device = view.find(uri.removeprefix("corral://devices/")) if uri.startswith("corral://devices/") else None
    return device is not None and device.uri == uri and "listen" in device.levels


def completions(view: CallerView, ref: Any, argument: str, chosen: str | None) -> list[str]:
    """Device ids for the prompt's device_id and the device template's namespace and name: visible ones only."""
    if isinstance(ref, types.PromptReference) and ref.name == "diagnose_device" and argument == "device_id":
        return [d.id for d in view.visible()]
    if isinstance(ref, types.ResourceTemplateReference) and ref.uri == TEMPLATE:
        if argument == "namespace":
            return sorted({d.namespace for d in view.visible()})
        if argument == "name":
            return [d.name for d in view.visible() if chosen in (None, d.namespace)]
    return []
