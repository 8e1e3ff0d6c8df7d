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
from typing import TYPE_CHECKING, Any, Literal

import kubernetes

from corral.api.codes import API_VERSION, CANCEL_ANNOTATION, FINAL_PHASES, GROUP, VERSION
from corral.decide.idempotency import compare

if TYPE_CHECKING:  # aiohttp, behind it, is a tenth of a second the command line's synchronous calls never need
    from corral.kube.client import AsyncApi


@dataclass(frozen=True)
class Submitted:
    code: Literal["CREATED", "DEDUP", "DENY_ID_CONFLICT"]
    intent: dict[str, Any]
    message: str


@dataclass(frozen=True)
class Identity:
    """Who the API server says the caller is: what an Intent's requester (or an Approval's approver) and their
    groups must be, as the admission policies check."""

    username: str
    groups: tuple[str, ...]


def identity(api_client: kubernetes.client.ApiClient) -> Identity:
    review = kubernetes.client.AuthenticationV1Api(api_client).create_self_subject_review({})
    user = review.status.user_info
    return Identity(str(user.username), tuple(str(g) for g in user.groups or ()))


def whoami(api_client: kubernetes.client.ApiClient) -> str:
    return identity(api_client).username


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
    from corral.kube.client import ApiError, path_of

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
              decision: Literal["Approve", "Deny"], reason: str = "", lifetime: timedelta = timedelta(minutes=5),
              *, expected_uid: str | None = None) -> dict[str, Any]:
    """Create an Approval (or a denial) for the Intent as it is now, in the caller's name. OwnRequest if it is the
    caller's own request: the controller would refuse that Approval, so it is not made. `expected_uid`: the Intent
    the person was shown (another one made under the same name since is refused, as decide_on_async does)."""
    objects = kubernetes.client.CustomObjectsApi(api_client)
    intent = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", intent_name)
    if expected_uid is not None and intent["metadata"]["uid"] != expected_uid:
        raise ValueError(f"Intent {intent_name} was replaced by another request under the same name since it was "
                         "shown; look at it again before deciding")
    status = intent.get("status") or {}
    if status.get("phase") != "AwaitingApproval" or not status.get("paramsHash"):
        raise ValueError(
            f"Intent {intent_name} is not waiting for approval (phase {status.get('phase') or 'not decided yet'})"
        )
    me = identity(api_client)
    requester, device = intent["spec"]["requester"], intent["spec"]["device"]
    if me.username == requester:
        raise OwnRequest(
            f"Intent {intent_name} is your own request ({requester}); nobody decides on their own request, so the "
            f"controller would refuse your {'approval' if decision == 'Approve' else 'denial'}. Another person with approve on Device {device} decides; to "
            f"withdraw it: kubectl annotate intent {intent_name} -n {namespace} {CANCEL_ANNOTATION}=REASON")
    body = approval_body(intent, decision, reason, me, lifetime)
    return objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "approvals", body)


class OwnRequest(ValueError):
    """The caller asked to decide on their own request (the two-person rule refuses it)."""


def approval_body(intent: dict[str, Any], decision: Literal["Approve", "Deny"], reason: str, me: Identity,
                  lifetime: timedelta) -> dict[str, Any]:
    """The Approval of this Intent as it is now (its UID and paramsHash), in `me`'s name and with their groups."""
    name = intent["metadata"]["name"]
    slug = re.sub(r"[^a-z0-9-]+", "-", me.username.lower()).strip("-")[-30:] or "user"
    return {
        "apiVersion": API_VERSION,
        "kind": "Approval",
        "metadata": {"name": f"{name[:200]}-{decision.lower()}-{slug}-{secrets.token_hex(3)}"},
        "spec": {
            "intent": {"name": name, "uid": intent["metadata"]["uid"]},
            "paramsHash": (intent.get("status") or {})["paramsHash"],
            "decision": decision,
            "approver": me.username,
            "approverGroups": list(me.groups),
            "reason": reason,
            "expiresAt": (datetime.now(UTC) + lifetime).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }



async def decide_on_async(api: AsyncApi, namespace: str, intent_name: str, decision: Literal["Approve", "Deny"],
                          reason: str, approver: str, groups: list[str] | tuple[str, ...],
                          lifetime: timedelta = timedelta(minutes=5), *, expected_uid: str | None = None
                          ) -> dict[str, Any]:
    """`decide_on()` on the event loop, for a caller whose identity is already known (the approval page: the
    username and groups of its SelfSubjectReview), with `api` acting as that very caller. The Approval also
    carries `approverGroups`, which an admission policy requires to equal the creator's groups.

    `expected_uid`: the Intent the person looked at; a different one under the same name (deleted and made
    again, perhaps with other parameters) is refused instead of approved."""
    from corral.kube.client import path_of

    intent = await api.request("GET", path_of(GROUP, VERSION, "intents", namespace, intent_name))
    if expected_uid is not None and intent["metadata"]["uid"] != expected_uid:
        raise ValueError(f"Intent {intent_name} was replaced by another request under the same name since you "
                         "looked at it; look at it again before deciding")
    status = intent.get("status") or {}
    if status.get("phase") != "AwaitingApproval" or not status.get("paramsHash"):
        raise ValueError(
            f"Intent {intent_name} is not waiting for approval (phase {status.get('phase') or 'not decided yet'})"
        )
    body = approval_body(intent, decision, reason, Identity(approver, tuple(groups)), lifetime)
    return await api.request("POST", path_of(GROUP, VERSION, "approvals", namespace), body=body)
