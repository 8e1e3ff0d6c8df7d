"""The tools that only read: iot.list_devices, iot.query and iot.read.

The device list and a device's state come from the caller's view (its own watch, no API call); sensor samples
come from the controller's readings, fetched with the caller's identity.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from corral.api.codes import READINGS_MAX_WINDOW_S
from corral.gateway import readings
from corral.gateway.tools.arguments import ArgumentError
from corral.gateway.tools.base import Call, Tool, ok, refusal, visible_device
from corral.gateway.tools.intents import paused_note
from corral.gateway.tools.schemas import READ_ONLY, device_id_schema
from corral.gateway.visible import VisibleDevice

_DEVICE_SUMMARY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "device_id": {"type": "string", "description": "namespace/name"},
        "name": {"type": ["string", "null"]}, "model": {"type": ["string", "null"]},
        "alias": {"type": "string"}, "location": {"type": "string"},
        "online": {"type": "boolean"}, "in_sync": {"type": ["boolean", "null"]},
        "actuators": {"type": "array", "items": {"type": "string"}},
        "sensors": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["device_id", "online", "actuators", "sensors"],
}
_AGENTS_PAUSED = {"type": "string", "description": "Present while agents are paused: where, since when, by whom, "
                                                   "why and how they are resumed"}
_DEVICE_LIST = {
    "type": "object",
    "properties": {"devices": {"type": "array", "items": _DEVICE_SUMMARY}, "agents_paused": _AGENTS_PAUSED},
    "required": ["devices"],
}
_QUERY_OUTPUT = {
    "type": "object",
    "description": "Without device_id: {devices: [...]}. With it: {device: {...}}.",
    "properties": {
        "devices": {"type": "array", "items": _DEVICE_SUMMARY},
        "agents_paused": _AGENTS_PAUSED,
        "device": {
            "type": "object",
            "properties": {
                **_DEVICE_SUMMARY["properties"],
                "reported": {"type": "object"}, "target": {"type": "object"},
                "sensors": {"type": "object", "description": "metric -> the latest sample: {value, unit, ts (epoch ms, "
                                                             "cite it in based_on), age_s (since the controller "
                                                             "received it)}"},
                "interlocks": {"type": "array", "items": {"type": "object"},
                               "description": "Safety rules guarding this device's actions"},
                "actions": {"type": "array", "items": {"type": "object"}},
                "stale": {"type": "boolean"}, "notes": {"type": "string"}, "agents_paused": _AGENTS_PAUSED,
            },
            "required": ["device_id", "online", "reported", "sensors", "actions"],
        },
    },
}
_READINGS_OUTPUT = {
    "type": "object",
    "properties": {
        "device_id": {"type": "string"},
        "window_s": {"type": "number"},
        "now": {"type": "integer", "description": "The controller's clock, Unix epoch ms."},
        "metrics": {"type": "object", "description": "metric -> {unit, samples: [{ts, value, age_s}]}, oldest first; "
                                                     "cite a sample's metric and ts in based_on"},
    },
    "required": ["device_id", "metrics"],
}


async def device_list(call: Call) -> types.CallToolResult:
    return ok({"devices": [d.summary() for d in call.view.visible()], **await paused_note(call)})


class ListDevices(Tool):
    name = "iot.list_devices"
    title = "List devices"
    description = "Devices you can see: id, alias, location, online, and the actuators and sensors you may use."
    output_schema = _DEVICE_LIST
    annotations = READ_ONLY

    def __init__(self) -> None:
        self.input_schema = {"type": "object", "properties": {}, "additionalProperties": False}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        return await device_list(call)


class Query(Tool):
    name = "iot.query"
    title = "Query a device"
    description = ("Without device_id: the device list. With it: reported state, sensor readings with ts (epoch ms) "
                   "and age, and the actions you may request with their parameter schemas.")
    output_schema = _QUERY_OUTPUT
    annotations = READ_ONLY

    def __init__(self, devices: list[VisibleDevice]) -> None:
        self.input_schema = {"type": "object", "properties": {"device_id": device_id_schema(devices)},
                             "additionalProperties": False}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        if args.get("device_id") in (None, ""):
            return await device_list(call)
        view = call.view
        device = visible_device(view, args.get("device_id"))
        detail = {**device.detail(view.now()), **await paused_note(call, device.namespace)}
        if "listen" in device.levels:
            # The latest sample the controller received, not the status (written at most every few seconds).
            try:
                latest = await samples(call, device, None, 0)
                detail["sensors"] = {metric: {**item["samples"][-1], "unit": item.get("unit", "")}
                                     for metric, item in latest["metrics"].items() if item["samples"]}
            except readings.ReadingsUnavailable as err:
                detail["sensors_note"] = f"From the Device status (the controller's readings: {err})."
        return ok({"device": detail})


class ReadSamples(Tool):
    name = "iot.read"
    title = "Read recent samples"
    description = ("Timestamped samples the controller received from a device, oldest first: each has the device's "
                   "ts (cite it in iot.control's based_on) and its age since the controller received it. window_s: "
                   "how far back (default 60 s; 0: only the latest sample of each metric).")
    output_schema = _READINGS_OUTPUT
    annotations = READ_ONLY

    def __init__(self, listenable: list[VisibleDevice]) -> None:
        self.input_schema = {"type": "object", "properties": {
            "device_id": device_id_schema(listenable),
            "metrics": {"type": "array", "items": {"type": "string"}, "maxItems": 32,
                        "description": "Only these metrics (default: all)."},
            "window_s": {"type": "number", "minimum": 0, "maximum": READINGS_MAX_WINDOW_S}},
            "required": ["device_id"], "additionalProperties": False}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        device = visible_device(call.view, args.get("device_id"))
        if "listen" not in device.levels:
            raise ArgumentError(f"You may not read the samples of {device.id}: that needs the 'listen' verb on it.",
                                "DENY_SCOPE")
        metrics_asked = args.get("metrics")
        if metrics_asked is not None and (not isinstance(metrics_asked, list)
                                          or not all(isinstance(m, str) for m in metrics_asked)):
            raise ArgumentError("metrics must be a list of metric names from iot.query.")
        window_s = args.get("window_s", 60)
        if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not 0 <= window_s <= READINGS_MAX_WINDOW_S:
            raise ArgumentError(f"window_s must be a number of seconds from 0 to {READINGS_MAX_WINDOW_S}.")
        try:
            found = await samples(call, device, metrics_asked, float(window_s))
        except readings.ReadingsUnavailable as err:
            return refusal("DEVICE_GONE", f"The readings of {device.id} could not be fetched: {err}")
        return ok({"device_id": device.id, "window_s": window_s, "now": found.get("now"),
                   "metrics": found.get("metrics") or {}})


async def samples(call: Call, device: VisibleDevice, metrics_asked: list[str] | None, window_s: float
                  ) -> dict[str, Any]:
    """The controller's readings of a device, as the caller may read them, in the tools' shape."""
    view = call.view
    document = await call.services.readings.fetch(view.follower.api, view.caller.authorization(), device.namespace,
                                                  device.name, metrics_asked, window_s)
    for item in (document.get("metrics") or {}).values():
        item["samples"] = [{"ts": s["ts"], "value": s["value"], "age_s": s["ageSeconds"]}
                           for s in item.get("samples") or []]
    return document
