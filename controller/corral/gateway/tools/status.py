"""iot.intent_status: the outcome of an earlier request, read (or waited for) with the caller's credentials."""

from __future__ import annotations

from typing import Any

import mcp_types as types

from corral.gateway.tools.arguments import ArgumentError
from corral.gateway.tools.base import Call, Tool, ok
from corral.gateway.tools.intents import final, outcome
from corral.gateway.tools.schemas import OUTCOME, READ_ONLY, REQUEST_ID_SCHEMA
from corral.kube.client import ApiError

MAX_WAIT_S = 60
_WAIT_S = {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S,
           "description": f"Seconds to wait for a final code (at most {MAX_WAIT_S}); 0 or omitted answers at once."}


class IntentStatus(Tool):
    name = "iot.intent_status"
    title = "Status of a request"
    description = ("The outcome of an earlier iot.control request, by its request_id. With wait_s it answers once the "
                   "request has a final code (e.g. after a human approved or denied it), or when wait_s has passed.")
    output_schema = OUTCOME
    annotations = READ_ONLY

    def __init__(self) -> None:
        self.input_schema = {"type": "object", "properties": {"request_id": REQUEST_ID_SCHEMA, "wait_s": _WAIT_S},
                             "required": ["request_id"], "additionalProperties": False}

    async def call(self, call: Call, args: dict[str, Any]) -> types.CallToolResult:
        view = call.view
        request_id = args.get("request_id")
        if not isinstance(request_id, str) or not request_id:
            raise ArgumentError("request_id is required: the one iot.control returned.")
        wait_s = args.get("wait_s") or 0
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= MAX_WAIT_S:
            raise ArgumentError(f"wait_s must be a number of seconds from 0 to {MAX_WAIT_S}.")
        for ns in view.namespaces:
            if not view.access.may(ns, "get", "intents", name=request_id):
                continue
            try:
                if wait_s:
                    intent = await view.follower.until(ns, request_id, final, float(wait_s))
                else:
                    intent = await view.follower.get(ns, request_id)
            except ApiError as err:
                if err.status in (403, 404):
                    continue
                raise
            return ok(outcome(intent, request_id))
        raise ArgumentError(f"No request {request_id!r} that you can see.", "DENY_SCOPE")
