"""Submitting Intents idempotently, approving them, and reading them back.

The Intent name is the idempotency key. `submit()` creates the Intent; if the
name exists already it compares the two requests: the same request returns
the earlier Intent (DEDUP: nothing runs twice), a different request under the
same name is refused (DENY_ID_CONFLICT). The gateway and the CLI both use it.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import kubernetes

from corral.api.codes import API_VERSION, FINAL_PHASES, GROUP, VERSION
from corral.client.asyncapi import ApiError, AsyncApi, path_of
from corral.decide.idempotency import compare


@dataclass(frozen=True)
class Submitted:
    code: Literal["CREATED", "DEDUP", "DENY_ID_CONFLICT"]
    intent: dict[str, Any]
    message: str


def whoami(api_client: kubernetes.client.ApiClient) -> str:
    review = kubernetes.client.AuthenticationV1Api(api_client).create_self_subject_review({})
    return str(review.status.user_info.username)


def submit(api_client: kubernetes.client.ApiClient, namespace: str, name: str, spec: dict[str, Any],
           annotations: dict[str, str] | None = None) -> Submitted:
    objects = kubernetes.client.CustomObjectsApi(api_client)
    try:
        created = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "intents",
                                                          _intent(name, spec, annotations))
        return Submitted("CREATED", created, f"Intent {name} created.")
    except kubernetes.client.ApiException as err:
        if err.status != 409:
            raise
    return _same_name(objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", name), spec)


async def submit_async(api: AsyncApi, namespace: str, name: str, spec: dict[str, Any],
                       annotations: dict[str, str] | None = None) -> Submitted:
    """`submit()` on the event loop (the gateway's path)."""
    collection = path_of(GROUP, VERSION, "intents", namespace)
    try:
        created = await api.request("POST", collection, body=_intent(name, spec, annotations))
        return Submitted("CREATED", created, f"Intent {name} created.")
    except ApiError as err:
        if err.status != 409:
            raise
    return _same_name(await api.request("GET", f"{collection}/{name}"), spec)


def _intent(name: str, spec: dict[str, Any], annotations: dict[str, str] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": API_VERSION, "kind": "Intent", "metadata": metadata, "spec": spec}


def _same_name(existing: dict[str, Any], spec: dict[str, Any]) -> Submitted:
    name = existing["metadata"]["name"]
    if compare(existing["spec"], spec) == "DEDUP":
        return Submitted("DEDUP", existing, f"Intent {name} exists with the same request; returning its outcome.")
    return Submitted(
        "DENY_ID_CONFLICT", existing,
        f"Intent {name} already exists with a different request; use a new request_id for a new request.",
    )


def outcome_code(status: dict[str, Any]) -> str:
    """What a caller is told an Intent's status means: its final code, or while there is none AWAITING_APPROVAL
    or PENDING; for a dry run the code it would end with (AWAITING_APPROVAL for one that would wait for a person)."""
    phase, code = status.get("phase"), status.get("code")
    if phase == "DryRun":
        return code or ("AWAITING_APPROVAL" if status.get("would") == "await_approval" else "PENDING")
    return code or ("AWAITING_APPROVAL" if phase == "AwaitingApproval" else "PENDING")


def wait_settled(api_client: kubernetes.client.ApiClient, namespace: str, name: str, timeout_s: float,
                 poll_s: float = 0.05) -> dict[str, Any]:
    """The Intent once it is final or awaiting approval, or as it is when timeout_s runs out."""
    objects = kubernetes.client.CustomObjectsApi(api_client)
    deadline = time.monotonic() + timeout_s
    while True:
        intent = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", name)
        phase = (intent.get("status") or {}).get("phase")
        if phase in FINAL_PHASES or phase == "AwaitingApproval" or time.monotonic() > deadline:
            return intent
        time.sleep(poll_s)


def decide_on(api_client: kubernetes.client.ApiClient, namespace: str, intent_name: str,
              decision: Literal["Approve", "Deny"], reason: str = "", lifetime: timedelta = timedelta(minutes=5)
              ) -> dict[str, Any]:
    """Create an Approval (or a denial) for the Intent as it is now, in the caller's name."""
    objects = kubernetes.client.CustomObjectsApi(api_client)
    intent = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", intent_name)
    status = intent.get("status") or {}
    if status.get("phase") != "AwaitingApproval" or not status.get("paramsHash"):
        raise ValueError(
            f"Intent {intent_name} is not waiting for approval (phase {status.get('phase') or 'not decided yet'})"
        )
    me = whoami(api_client)
    slug = re.sub(r"[^a-z0-9-]+", "-", me.lower()).strip("-")[-30:] or "user"
    body = {
        "apiVersion": API_VERSION,
        "kind": "Approval",
        "metadata": {"name": f"{intent_name[:200]}-{decision.lower()}-{slug}-{secrets.token_hex(3)}"},
        "spec": {
            "intent": {"name": intent_name, "uid": intent["metadata"]["uid"]},
            "paramsHash": status["paramsHash"],
            "decision": decision,
            "approver": me,
            "reason": reason,
            "expiresAt": (datetime.now(UTC) + lifetime).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }
    return objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "approvals", body)

