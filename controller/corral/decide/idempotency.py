"""The Intent name is the idempotency key: the same request twice is one request.

Shared by the gateway and the CLI: when creating an Intent meets an existing
one of that name, `compare()` says whether it is the same request (return the
earlier outcome: DEDUP, nothing runs twice) or a different one under a reused
name (DENY_ID_CONFLICT). Once the earlier Intent is deleted (after its retention), the controller answers
the same from the audit log (audit.requests), by `identity_hash()`.

A timed hold is one request about two values: `holdFor` and `then` (what is put back, and when) are part of
both the identity and the hash an approval binds to, so a replay with another `then` is another request and an
approval of "locked = true" never covers "locked = true, then false after 8 s". They enter only when present:
the hashes of Intents without a hold (and the records and approvals made for them before) stay as they were.
"""

from __future__ import annotations

from typing import Any, Literal

from corral.api.durations import seconds_of
from corral.contract.canonical import sha256_hex

# What makes two requests the same request. The reason is what a person reads,
# not what runs; a retry that rephrases it is still the same request.
_IDENTITY_FIELDS = ("device", "actuator", "action", "params", "requester", "basedOn", "holdFor", "then")
# What runs, and so what an approval binds to: the hold's fields only when the Intent has them.
_HOLD_FIELDS = ("holdFor", "then")


def request_identity(spec: dict[str, Any]) -> dict[str, Any]:
    return {key: _field(key, spec.get(key)) for key in _IDENTITY_FIELDS if spec.get(key) not in (None, [])}


def _field(key: str, value: Any) -> Any:
    """A field as it is compared: `holdFor` as its seconds (8s and 8000ms are one hold), the rest normalized."""
    if key == "holdFor" and isinstance(value, str):
        try:
            return _normalize(seconds_of(value))
        except ValueError:
            return value  # not a duration: compared as written (the API server refuses it anyway)
    return _normalize(value)


def _normalize(value: Any) -> Any:
    """16 and 16.0 are the same number in JSON; make them hash alike."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


def identity_hash(spec: dict[str, Any]) -> str:
    """The request's identity as a hash: what an `intent.decided` record keeps, so that a replay can be told
    from a new request after the Intent itself is gone (audit.requests)."""
    return sha256_hex(request_identity(spec))


def compare(existing_spec: dict[str, Any], new_spec: dict[str, Any]) -> Literal["DEDUP", "DENY_ID_CONFLICT"]:
    same = identity_hash(existing_spec) == identity_hash(new_spec)
    return "DEDUP" if same else "DENY_ID_CONFLICT"


def params_hash(namespace: str, spec: dict[str, Any]) -> str:
    """What an approval binds to: where, what and with which value (not who or why); for a timed hold also how
    long and what is put back after it."""
    bound = {
        "namespace": namespace,
        "device": spec.get("device"),
        "actuator": spec.get("actuator"),
        "action": spec.get("action"),
        "params": _normalize(spec.get("params")),
    }
    bound.update({key: _field(key, spec[key]) for key in _HOLD_FIELDS if spec.get(key) is not None})
    return sha256_hex(bound)
