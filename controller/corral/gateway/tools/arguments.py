"""The checks every Intent-making tool runs on its arguments, before anything is created.

The controller checks all of it again: the gateway is not trusted. It only spares the model a round trip and
gives it a precise answer, in the code the controller would have given.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from pydantic import ValidationError

from corral.api.codes import DecisionCode
from corral.api.intent import IntentSpec

REQUEST_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_HOLD_S = 86400  # the Intent's own bound on holdFor (24h)


class ArgumentError(ValueError):
    """A call the gateway refuses before creating anything: `code` from the one vocabulary (the one the
    controller would have given), str() what was wrong and what is allowed."""

    def __init__(self, message: str, code: DecisionCode = "DENY_ARGUMENTS") -> None:
        super().__init__(message)
        self.code: DecisionCode = code


def optional_reason(arguments: dict[str, Any], tool: str) -> str:
    """The reason given, or one naming the tool; at most 512 characters without control characters."""
    reason = arguments.get("reason") or f"{tool} through the MCP gateway"
    if not isinstance(reason, str) or CONTROL.search(reason) or len(reason) > 512:
        raise ArgumentError("reason must be at most 512 characters, without control characters.")
    return reason


def request_id(given: Any) -> str:
    if given is None:
        return f"mcp-{secrets.token_hex(8)}"
    if not isinstance(given, str) or not REQUEST_ID.fullmatch(given):
        raise ArgumentError("request_id must be 1-63 lower-case letters, digits or '-', starting and ending with a "
                            f"letter or digit; got {given!r}.")
    return given


def hold_for(given: Any) -> str | None:
    """`hold_for_s` (seconds) as an Intent's spec.holdFor: whole milliseconds, written as "20s" or "1500ms"."""
    if given is None:
        return None
    if isinstance(given, bool) or not isinstance(given, int | float) or not 0 < given <= MAX_HOLD_S:
        raise ArgumentError(f"hold_for_s must be a number of seconds, more than 0 and at most {MAX_HOLD_S} (24 h); "
                            f"got {given!r}.")
    ms = round(given * 1000)
    if ms < 1:
        raise ArgumentError(f"hold_for_s must be at least 0.001 s (one millisecond); got {given!r}.")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def fits_an_intent(spec: dict[str, Any]) -> None:
    try:
        IntentSpec.model_validate(spec)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()[:5])
        raise ArgumentError(f"The request does not fit an Intent: {problems}.") from None
