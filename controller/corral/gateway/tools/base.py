"""What every gateway tool is, and what it is called with, as Home Assistant's llm helpers shape a Tool.

A tool is one object: its name, title, description, input and output schemas and annotations (what tools/list
shows), and `call`, what it does. The caller's view decides which tools exist for the caller (`toolset`); a tool
object only ever runs for a caller it was listed for. Everything a tool may refuse is answered here in the one
vocabulary: a code in structuredContent, and the text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import mcp_types as types

from corral.api.codes import DecisionCode
from corral.client.errors import api_message
from corral.gateway.readings import Readings
from corral.gateway.tools.arguments import ArgumentError
from corral.gateway.view import CallerView
from corral.gateway.visible import VisibleDevice
from corral.kube.client import ApiError


class RateLimit:
    """At most `calls` control calls per caller in any `per_s` window (a token bucket per caller).

    A flood from one agent must not become a flood of Intents; other callers are not affected.
    """

    def __init__(self, calls: int, per_s: float) -> None:
        self.calls, self.per_s = calls, per_s
        self._buckets: dict[str, tuple[float, float]] = {}  # caller key -> (tokens, at)

    def take(self, key: str, now: float, count: int = 1) -> float:
        """0 when `count` calls (a group's devices, one each) may go ahead, all of them, else the seconds until they
        may (infinite when `count` is more than the limit ever allows)."""
        if self.calls <= 0:
            return 0.0
        if count > self.calls:
            return float("inf")
        rate = self.calls / self.per_s
        tokens, at = self._buckets.get(key, (float(self.calls), now))
        tokens = min(float(self.calls), tokens + (now - at) * rate)
        if tokens >= count:
            self._buckets[key] = (tokens - count, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (count - tokens) / rate


@dataclass
class Services:
    """What the gateway lends every tool call, the same for every caller: how long a call waits for its Intent,
    the control rate limit (RateLimit), the readings, and the leases taken through this gateway."""

    wait_s: float
    rate_limit: RateLimit
    readings: Readings
    held: dict[tuple[str, str, str, str], CallerView] = field(default_factory=dict)  # (caller, ns, device, holder)


@dataclass(frozen=True)
class Call:
    """One tool call: whose view it runs in, the gateway's services, and who holds a lease it takes (the client's
    `holder`, else the session's)."""

    view: CallerView
    services: Services
    holder: str | None = None


class Tool:
    """One MCP tool. Subclasses set the texts and schemas (in __init__ where they depend on the caller's devices)
    and implement `call`."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    annotations: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        """The tool as tools/list shows it (JSON-ready)."""
        return {"name": self.name, "title": self.title, "description": self.description,
                "inputSchema": self.input_schema, "outputSchema": self.output_schema,
                "annotations": {"title": self.title, **self.annotations}}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        raise NotImplementedError

    async def answer(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        """`call`, with what it refuses (its arguments, or the API server as the caller) as a refusal."""
        try:
            return await self.call(call, args)
        except ArgumentError as err:
            return refusal(err.code, str(err))
        except kubernetes.client.ApiException as err:
            return refusal(code_of(err.status), f"The Kubernetes API refused: {err.status} {err.reason}: "
                                                f"{api_message(err)}")
        except ApiError as err:
            return refusal(code_of(err.status), f"The Kubernetes API refused: {err.status} {err.reason}: "
                                                f"{err.message}")


def ok(data: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(data, separators=(",", ":")))],
                                structured_content=data)


def refusal(code: DecisionCode | str, message: str, extra: dict[str, Any] | None = None) -> types.CallToolResult:
    """A refusal in the one vocabulary: the code in structuredContent (what an Intent would carry), and the text."""
    data = {**(extra or {}), "code": code, "message": message}
    return types.CallToolResult(content=[types.TextContent(text=f"{code}: {message}")], structured_content=data,
                                is_error=True)


def code_of(status: int) -> DecisionCode:
    """The code for an API server's refusal of a call made as the caller."""
    if status in (401, 403):
        return "DENY_SCOPE"
    if status in (400, 422):
        return "DENY_ARGUMENTS"
    if status == 404:
        return "DEVICE_GONE"
    return "FAILED"


def visible_device(view: CallerView, device_id: Any) -> VisibleDevice:
    device = view.find(device_id)
    if device is None:
        # The same answer for a device that does not exist and one the caller may not read.
        raise ArgumentError(f"No device {device_id!r} among the devices you can see; device_id is namespace/name "
                            "from iot.list_devices.", "DEVICE_GONE")
    return device
