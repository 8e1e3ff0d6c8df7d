"""iot.set_alias, iot.set_note and iot.set_location: a person's or agent's words about a device, set by Intent.

The overlay never reaches the device; the controller makes the text safe and writes it. It needs the `annotate`
verb on the Device (not `patch`) and the right to create Intents in its namespace.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from corral.api.codes import OUTCOME_CODES
from corral.api.intent import OVERLAY_ACTIONS, OVERLAY_LIMITS
from corral.gateway.tools.arguments import CONTROL, ArgumentError, fits_an_intent, optional_reason, request_id
from corral.gateway.tools.base import Call, Tool, ok, refusal, visible_device
from corral.gateway.tools.intents import paused_refusal, submit_and_settle
from corral.gateway.tools.schemas import BOOKKEEPING, REASON, REQUEST_ID_SCHEMA, device_id_schema
from corral.gateway.visible import VisibleDevice

# Tool -> (Intent action, overlay field, argument name).
OVERLAY_TOOLS = {f"iot.{action}": (action, field, "note" if field == "notes" else field)
                 for action, field in OVERLAY_ACTIONS.items()}
_OVERLAY_OUTPUT = {
    "type": "object",
    "properties": {"device_id": {"type": "string"}, "field": {"type": "string"}, "value": {"type": "string"},
                   "request_id": {"type": "string"}, "code": {"type": "string", "enum": list(OUTCOME_CODES)},
                   "message": {"type": "string"}},
    "required": ["device_id", "field", "value", "code", "message"],
}


class SetOverlay(Tool):
    """One overlay field's tool (the three differ only in the field)."""

    output_schema = _OVERLAY_OUTPUT
    annotations = BOOKKEEPING

    def __init__(self, name: str, annotatable: list[VisibleDevice]) -> None:
        _, field, argument = OVERLAY_TOOLS[name]
        self.name, self.title = name, f"Set a device's {field}"
        self.description = (
            f"Set the {field} people and agents know the device by (at most {OVERLAY_LIMITS[field]} characters; "
            "control and invisible characters are removed; empty deletes it). It never reaches the device; "
            "it is stored as data and shown to others only as data.")
        self.input_schema = {"type": "object", "properties": {
            "device_id": device_id_schema(annotatable),
            argument: {"type": "string", "maxLength": OVERLAY_LIMITS[field]},
            "reason": {**REASON, "description": "Why, in one sentence (audited); optional."},
            "request_id": REQUEST_ID_SCHEMA},
            "required": ["device_id", argument], "additionalProperties": False}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        """An Intent like any other (action set_alias, set_note or set_location); the controller writes it."""
        view, tool = call.view, self.name
        device = visible_device(view, args.get("device_id"))
        if device not in view.annotatable() or device.namespace not in view.grants().create_intents:
            raise ArgumentError(f"You may not change the overlay of {device.id}: that needs the 'annotate' verb on it "
                                "and the right to create Intents.", "DENY_SCOPE")
        request, spec = overlay_spec(device, tool, args, view.username or "")
        paused = await paused_refusal(call, device.namespace, {
            "device_id": device.id, "field": OVERLAY_TOOLS[tool][2], "value": spec["params"]["value"],
            "request_id": request})
        if paused is not None:
            return paused
        answer = await submit_and_settle(call, device.namespace, request, spec)
        _, field, argument = OVERLAY_TOOLS[tool]
        value = (answer.get("after") or {}).get(field, spec["params"]["value"])
        result = {"device_id": device.id, "field": argument, "value": value, "request_id": request,
                  "code": answer["code"], "message": answer["message"]}
        if answer["code"] in ("EXECUTED", "DEDUP", "PENDING"):
            return ok(result)
        return refusal(answer["code"], answer["message"], result)


def overlay_spec(device: VisibleDevice, tool: str, arguments: dict[str, Any], requester: str
                 ) -> tuple[str, dict[str, Any]]:
    """An overlay tool's arguments as (request_id, Intent spec); the controller makes the text safe and writes it."""
    action, field, argument = OVERLAY_TOOLS[tool]
    text = arguments.get(argument)
    if not isinstance(text, str):
        raise ArgumentError(f"{argument} must be a string (at most {OVERLAY_LIMITS[field]} characters; empty deletes "
                            "it).")
    reason = optional_reason(arguments, tool)
    request = request_id(arguments.get("request_id"))
    spec = {"device": device.name, "actuator": field, "action": action,
            "params": {"value": CONTROL.sub("", text)[: OVERLAY_LIMITS[field]]}, "reason": reason,
            "requester": requester}
    fits_an_intent(spec)
    return request, spec
