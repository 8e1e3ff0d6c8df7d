"""iot.acquire and iot.release: exclusive control of a device, taken and given back by Intent.

A lease is held by the caller and a holder id (the client's `holder`, else the MCP session's). The gateway
remembers the leases taken through it, so that a session's end gives them back (`release_held`).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import mcp_types as types

from corral.api.intent import LEASE_ACTUATOR
from corral.client.intents import submit_async
from corral.gateway.tools.arguments import ArgumentError, fits_an_intent, optional_reason, request_id
from corral.gateway.tools.base import Call, Services, Tool, ok, refusal, visible_device
from corral.gateway.tools.intents import submit_and_settle
from corral.gateway.tools.schemas import BOOKKEEPING, HOLDER, OUTCOME, REASON, REQUEST_ID_SCHEMA
from corral.gateway.visible import VisibleDevice
from corral.kube.client import ApiError

log = logging.getLogger(__name__)

LEASE_TOOLS = {"iot.acquire": "acquire", "iot.release": "release"}


class Acquire(Tool):
    name = "iot.acquire"
    title = "Take exclusive control of a device"
    description = (
        "While you hold a device's lease, nobody else's requests act on it (they get DENY_LEASED with your "
        "name and reason); reads stay open to all. Every call of yours on the device renews it; it ends after "
        "ttl_s seconds without one (default 300), when you call iot.release, when a person breaks it, or "
        "when this MCP session ends (stdio and handshake-era HTTP have sessions; 2026-07-28 has none; an HTTP "
        "session ends after 5 minutes without a request, by default). Pass holder to keep a lease beyond the session.")
    output_schema = OUTCOME
    annotations = BOOKKEEPING

    def __init__(self, device_id: dict[str, Any]) -> None:
        self.input_schema = {"type": "object", "properties": {
            "device_id": device_id, "ttl_s": {"type": "integer", "minimum": 1, "maximum": 3600},
            "reason": REASON, "holder": HOLDER, "request_id": REQUEST_ID_SCHEMA},
            "required": ["device_id", "reason"], "additionalProperties": False}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        return await _lease(self.name, call, args)


class Release(Tool):
    name = "iot.release"
    title = "Give back exclusive control of a device"
    description = "End your lease of the device, so that others may act on it again."
    output_schema = OUTCOME
    annotations = BOOKKEEPING

    def __init__(self, device_id: dict[str, Any]) -> None:
        self.input_schema = {"type": "object", "properties": {
            "device_id": device_id, "holder": HOLDER, "request_id": REQUEST_ID_SCHEMA},
            "required": ["device_id"], "additionalProperties": False}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        return await _lease(self.name, call, args)


async def _lease(tool: str, call: Call, args: dict[str, Any]) -> types.CallToolResult:
    view, holder = call.view, call.holder
    device = visible_device(view, args.get("device_id"))
    if not view.grants().controllable(device) or device.namespace not in view.grants().create_intents:
        raise ArgumentError(f"You may not take or give back control of {device.id}: it needs the 'write' verb "
                            "on it and the right to create Intents in its namespace.", "DENY_SCOPE")
    request, spec = lease_spec(device, tool, args, view.username or "", holder)
    answer = await submit_and_settle(call, device.namespace, request, spec)
    key = (view.caller.key, device.namespace, device.name, holder or "")
    if answer["code"] == "EXECUTED":
        if tool == "iot.acquire":
            call.services.held[key] = view
        else:
            call.services.held.pop(key, None)
    result = {**answer, "holder": holder}
    return ok(result) if answer["code"] in ("EXECUTED", "DEDUP") else refusal(answer["code"], answer["message"],
                                                                              result)


def lease_spec(device: VisibleDevice, tool: str, arguments: dict[str, Any], requester: str, holder: str | None
               ) -> tuple[str, dict[str, Any]]:
    """iot.acquire / iot.release arguments as (request_id, Intent spec)."""
    action = LEASE_TOOLS[tool]
    reason = optional_reason(arguments, tool)
    spec: dict[str, Any] = {"device": device.name, "actuator": LEASE_ACTUATOR, "action": action, "reason": reason,
                            "requester": requester}
    ttl = arguments.get("ttl_s")
    if action == "acquire" and ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= 3600:
            raise ArgumentError("ttl_s must be a whole number of seconds from 1 to 3600.")
        spec["params"] = {"value": ttl}
    if holder:
        spec["holderId"] = holder
    fits_an_intent(spec)
    return request_id(arguments.get("request_id")), spec


async def release_held(services: Services, holder_of_session: str | None = None) -> None:
    """A session ends: the leases it took through this gateway are given back (release Intents); without
    `holder_of_session`, every lease (a stdio gateway's one session)."""
    for key, view in list(services.held.items()):
        _, namespace, name, holder = key
        if holder_of_session is not None and holder != holder_of_session:
            continue
        services.held.pop(key, None)
        spec = {"device": name, "actuator": "lease", "action": "release", "reason": "the MCP session ended",
                "requester": view.username or "", **({"holderId": holder} if holder else {}),
                **({"requesterGroups": list(view.groups)} if view.groups else {})}
        try:
            await submit_async(view.follower.api, namespace, f"mcp-release-{secrets.token_hex(8)}", spec)
        except ApiError as err:
            log.warning("could not give back the lease of %s/%s at the session's end: %s", namespace, name, err)
