"""The Intent name is the idempotency key: the same request twice is one request.

Shared by the gateway and the CLI: when creating an Intent meets an existing
one of that name, `compare()` says whether it is the same request (return the
earlier outcome: DEDUP, nothing runs twice) or a different one under a reused
name (DENY_ID_CONFLICT). Once the earlier Intent is deleted (after its retention), the controller answers
the same from the audit log (audit.requests), by `identity_hash()`.
"""

from __future__ import annotations

from typing import Any, Literal

from corral.contract.canonical import sha256_hex

# What makes two requests the same request. The reason is what a person reads,
# not what runs; a retry that rephrases it is still the same request.
_IDENTITY_FIELDS = ("device", "actuator", "action", "params", "requester", "basedOn")


def request_identity(spec: dict[str, Any]) -> dict[str, Any]:
    return {key: _normalize(spec.get(key)) for key in _IDENTITY_FIELDS if spec.get(key) not in (None, [])}


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
    """What an approval binds to: where, what and with which value (not who or why)."""
    return sha256_hex(
        {
            "namespace": namespace,
            "device": spec.get("device"),
            "actuator": spec.get("actuator"),
            "action": spec.get("action"),
            "params": _normalize(spec.get("params")),
        }
    )
