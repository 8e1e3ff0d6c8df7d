"""A Device's lease as Corral keeps it in a `coordination.k8s.io/v1` Lease: the object's name, label and
annotations, the fields Corral reads (a small model: Kubernetes owns the kind, not Corral), and the bodies
Corral writes.

One Lease per leased Device, `corral-lease-DEVICE` in its namespace, labelled `corral.dev/lease=DEVICE`:
`spec.holderIdentity` is `USERNAME/HOLDER-ID`, `leaseDurationSeconds` the idle TTL, `renewTime` the last call
of the holder. Annotations keep what people read: the holder's username and id, the reason, and for a lease a
person broke, who broke it, when and why.

Apart from the controller that writes them (reconcile/guards/leases.py) so that `corral lease list` reads them
with the same words without importing a reconciler; what one holds now is decide/leases.py's to say.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from corral.api.base import ObjectMeta

API_VERSION: Final = "coordination.k8s.io/v1"
GROUP, VERSION, PLURAL = "coordination.k8s.io", "v1", "leases"
LABEL: Final = "corral.dev/lease"
HOLDER: Final = "corral.dev/holder"
HOLDER_ID: Final = "corral.dev/holder-id"
REASON: Final = "corral.dev/reason"
BROKEN_BY: Final = "corral.dev/broken-by"
BROKEN_REASON: Final = "corral.dev/broken-reason"
BROKEN_AT: Final = "corral.dev/broken-at"


def lease_name(device: str) -> str:
    return f"corral-lease-{device}"


class _Read(BaseModel):
    # Kubernetes' kind, not ours: its other fields (leaseTransitions, strategy, ...) are kept, not refused.
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True, extra="allow")


class LeaseSpec(_Read):
    """The fields of a Lease's spec Corral reads. Times stay text: one that does not parse holds nothing."""

    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None


class LeaseObject(_Read):
    """A Lease as the API server returned it, read once where it enters."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LeaseSpec = Field(default_factory=LeaseSpec)

    @property
    def device(self) -> str | None:
        """The Device it leases (its label); None for a Lease that is not Corral's."""
        return (self.metadata.labels or {}).get(LABEL) or None

    def annotation(self, key: str) -> str:
        return (self.metadata.annotations or {}).get(key, "")


def lease_body(namespace: str, device: str, holder: str, holder_id: str | None, ttl_s: int, reason: str,
               acquired: str, now: datetime) -> dict[str, Any]:
    """The Lease of a Device newly taken (or renewed) by this holder."""
    identity = f"{holder}/{holder_id}" if holder_id else holder
    annotations: dict[str, Any] = {HOLDER: holder, REASON: reason[:512]}
    if holder_id:
        annotations[HOLDER_ID] = holder_id
    return {
        "apiVersion": API_VERSION, "kind": "Lease",
        "metadata": {"name": lease_name(device), "namespace": namespace, "labels": {LABEL: device},
                     "annotations": annotations},
        "spec": {"holderIdentity": identity[:1024], "leaseDurationSeconds": ttl_s, "acquireTime": acquired,
                 "renewTime": micro(now)},
    }


def renewed(current: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The Lease as it was, renewed now: every other field kept for the write (a PUT replaces the object)."""
    return {**current, "spec": {**current.get("spec", {}), "renewTime": micro(now)}}


def tombstone(current: dict[str, Any], by: str, reason: str, now: datetime) -> dict[str, Any]:
    """The Lease as it was, held by nobody, remembering who broke it, when and why."""
    metadata = current.get("metadata", {})
    annotations = {**metadata.get("annotations", {}), BROKEN_BY: by, BROKEN_REASON: reason[:512], BROKEN_AT: micro(now)}
    return {**current, "metadata": {**metadata, "annotations": annotations},
            "spec": {**current.get("spec", {}), "holderIdentity": None}}


def versioned(body: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
    """The body to write over the Lease read at `resource_version`: the API server refuses it if that has changed."""
    return {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": resource_version}}


def micro(moment: datetime) -> str:
    """A MicroTime, as Lease fields are written."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
