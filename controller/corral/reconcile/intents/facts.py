"""The Intent as the controller reads it, and the facts the pure decision is given about it.

`StoredIntent` is `api.intent.Intent` as the API server keeps it. The request model refuses an overlay text
that is too long, a lease TTL below one second or a value that is not a scalar; the CRD schema cannot say
so, and the decision judges each of those itself (DENY_ARGUMENTS, or a bounded text), on record. So the
stored model keeps the API's fields and their limits but leaves those argument checks (and the timed hold's) to
`decide`: an Intent
that passes the API server is decided, as before, and only one the API server could not have stored is
malformed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field, model_validator

from corral.api.codes import API_VERSION, CANCEL_ANNOTATION
from corral.api.durations import seconds_of
from corral.api.intent import Intent, IntentSpec, IntentStatus, Params
from corral.contract.values import InvalidValue, check
from corral.decide.decision import DeviceFacts, IntentFacts
from corral.decide.evidence import Observation
from corral.kube.events import ObjectRef
from corral.kube.typed import Body
from corral.reconcile.devices.port import DeviceView


class StoredParams(Params):
    """Any JSON value: whether it fits the actuator is the decision's to say (DENY_ARGUMENTS)."""

    value: Any = Field(default=None)


class StoredSpec(IntentSpec):
    """The spec as stored: the request model's argument rules are judged by `decide`, not refused here."""

    params: StoredParams | None = None
    then: StoredParams | None = None

    @model_validator(mode="after")
    def _params_unless_read(self) -> StoredSpec:  # overrides IntentSpec's: decide judges the arguments
        return self

    @model_validator(mode="after")
    def _held_only_when_acting(self) -> StoredSpec:  # overrides IntentSpec's: decide judges the hold too
        return self


class StoredIntent(Intent):
    """An Intent as the API server has it, read once where it enters the controller."""

    spec: StoredSpec


def name_of(intent: StoredIntent) -> str:
    """namespace/name, for logs and audit records."""
    return f"{intent.metadata.namespace}/{intent.metadata.name}"


def namespace_of(intent: StoredIntent) -> str:
    return intent.metadata.namespace or ""


def uid_of(intent: StoredIntent) -> str:
    return intent.metadata.uid or ""


def created_at(intent: StoredIntent) -> datetime:
    created = intent.metadata.creation_timestamp
    assert created is not None, "the API server sets creationTimestamp"
    return created


def status_of(intent: StoredIntent) -> IntentStatus:
    """The status, empty before the controller first wrote one."""
    return intent.status if intent.status is not None else IntentStatus()


def value_of(intent: StoredIntent) -> Any:
    """params.value as it was asked (None for a read and the lease actions without one)."""
    return intent.spec.params.value if intent.spec.params is not None else None


def ref_of(intent: StoredIntent) -> ObjectRef:
    meta = intent.metadata
    return ObjectRef(API_VERSION, "Intent", meta.name or "", meta.namespace, meta.uid)


def trace_source(intent: StoredIntent) -> Body:
    """The metadata tracing.FirstTraces reads (uid and the traceparent annotation)."""
    return {"metadata": {"uid": intent.metadata.uid, "annotations": intent.metadata.annotations or {}}}


def spec_body(intent: StoredIntent) -> Body:
    """The spec as the API server sent it (camelCase, unset fields left out), for params_hash and the audit."""
    return intent.spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def facts_of(intent: StoredIntent, view: DeviceView | None, labels: dict[str, str]) -> tuple[IntentFacts, DeviceFacts]:
    """What the pure decision is told about the Intent and its Device."""
    meta, spec = intent.metadata, intent.spec
    facts = IntentFacts(
        uid=uid_of(intent),
        name=meta.name or "",
        device=spec.device,
        actuator=spec.actuator,
        action=spec.action,
        value=value_of(intent),  # none for a read
        requester=spec.requester,
        created_at=created_at(intent),
        based_on=tuple(Observation(o.metric, o.ts, o.device_id) for o in spec.based_on),
        cancelled=(meta.annotations or {}).get(CANCEL_ANNOTATION),
        holder_id=spec.holder_id,
        dry_run=spec.dry_run,
        hold_for_s=seconds_of(spec.hold_for) if spec.hold_for is not None else None,
        then=spec.then.value if spec.then is not None else None,
    )
    device = DeviceFacts(
        exists=view is not None and view.exists,
        device_id=view.device_id if view is not None else None,
        contract=view.contract if view is not None else None,
        online=view.online if view is not None else None,
        present=view is not None,
        labels=labels,
    )
    return facts, device


def device_labels(view: DeviceView | None) -> dict[str, str]:
    """The Device's labels (grants select by them)."""
    if view is None or view.device is None:
        return {}
    return dict(view.device.metadata.labels or {})


def checked_value(view: DeviceView | None, intent: StoredIntent) -> Any:
    """The Intent's value in its canonical type for the device's contract, or None if it no longer fits."""
    contract = view.contract if view is not None else None
    actuator = contract.actuator(intent.spec.actuator) if contract is not None else None
    if actuator is None or actuator.action != intent.spec.action:
        return None
    try:
        return check(actuator, value_of(intent))
    except InvalidValue:
        return None

