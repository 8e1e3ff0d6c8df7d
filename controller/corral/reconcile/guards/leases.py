"""Device leases: exclusive control, kept as `coordination.k8s.io/v1` Lease objects that only the controller writes.

One Lease per leased Device, `corral-lease-DEVICE` in its namespace, labelled `corral.dev/lease=DEVICE`:
`spec.holderIdentity` is `USERNAME/HOLDER-ID`, `leaseDurationSeconds` the idle TTL, `renewTime` the last call
of the holder; it has expired when renewTime + TTL has passed (judged when deciding, and the object is then
deleted). Annotations keep what people read: the holder's username and id, the reason, and for a lease a
person broke, who broke it, when and why (so the former holder's next call can say so) until it would have
expired. Writes carry the resourceVersion they were decided on: two holders racing for one Device cannot
both get it. The objects survive a controller restart; agents have no rights on them (`kubectl get leases`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from corral.contract.text import written_text
from corral.decide.decision import Broken, Lease
from corral.kube.cache import Body
from corral.kube.client import ApiError, AsyncApi, path_of
from corral.kube.informer import Informer
from corral.kube.tasks import cancel_all

log = logging.getLogger(__name__)

LABEL = "corral.dev/lease"
HOLDER = "corral.dev/holder"
HOLDER_ID = "corral.dev/holder-id"
REASON = "corral.dev/reason"
BROKEN_BY = "corral.dev/broken-by"
BROKEN_REASON = "corral.dev/broken-reason"
BROKEN_AT = "corral.dev/broken-at"
EXPIRY_SWEEP_S = 5.0
WRITE_ATTEMPTS = 5


def lease_name(device: str) -> str:
    return f"corral-lease-{device}"


class LeaseTaken(Exception):
    """Another holder has it (message: who, why, until when)."""


class Leases:
    def __init__(self, api: AsyncApi, namespaces: tuple[str, ...], on_change: Callable[[str, str], None],
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api = api
        self._objects: dict[tuple[str, str], Body] = {}  # (namespace, device) -> Lease object
        self._on_change = on_change
        self._clock = clock
        self.informer = Informer(api, "coordination.k8s.io", "v1", "leases", LABEL, namespaces, self._on_event)
        self._sweeper: list[asyncio.Task[None]] = []

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    def start(self) -> None:
        self.informer.start()
        self._sweeper = [asyncio.create_task(self._sweep(), name="lease expiry")]

    async def stop(self) -> None:
        await cancel_all(self._sweeper)
        await self.informer.stop()

    def _on_event(self, kind: str, body: Body) -> None:
        meta = body["metadata"]
        device = (meta.get("labels") or {}).get(LABEL)
        if not device:
            return
        key = (meta["namespace"], device)
        if kind == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = body
        self._on_change(*key)

    # ---- what guards an Intent --------------------------------------------------------------------------------

    def guard(self, namespace: str, device: str) -> tuple[Lease | None, Broken | None]:
        body = self._objects.get((namespace, device))
        return (None, None) if body is None else parse(body)

    def held(self, namespace: str) -> list[tuple[str, Lease]]:
        """The Devices of the namespace (all namespaces: "") under a lease now, with it."""
        now = self._clock()
        found = []
        for (ns, device), body in sorted(self._objects.items()):
            lease, _ = parse(body)
            if (not namespace or ns == namespace) and lease is not None and lease.expires_at > now:
                found.append((f"{ns}/{device}", lease))
        return found

    # ---- writes -----------------------------------------------------------------------------------------------

    async def acquire(self, namespace: str, device: str, holder: str, holder_id: str | None, ttl_s: int,
                      reason: str) -> Lease:
        """Take (or renew) the Device's lease for this holder; LeaseTaken when another holds it."""
        now = self._clock()

        def take(current: Body | None) -> Body | None:
            lease, _ = parse(current) if current is not None else (None, None)
            if lease is not None and lease.expires_at > now and (lease.holder, lease.holder_id) != (holder, holder_id):
                raise LeaseTaken(f"Device {device} is leased to {lease.who()}"
                                 + (f" ({lease.reason})" if lease.reason else "")
                                 + f" until {lease.expires_at:%H:%M:%S} UTC.")
            kept = lease is not None and lease.expires_at > now
            acquired = (current or {}).get("spec", {}).get("acquireTime") if kept else None
            return _lease_body(namespace, device, holder, holder_id, ttl_s, reason, acquired or _micro(now), now)

        written = await self._write(namespace, device, take)
        lease, _ = parse(written) if written is not None else (None, None)
        assert lease is not None
        return lease

    async def renew(self, namespace: str, device: str, holder: str, holder_id: str | None) -> None:
        """A call by the holder touched the Device: its idle TTL starts again. Nothing when it holds none."""
        lease, _ = self.guard(namespace, device)
        now = self._clock()
        if lease is None or lease.expires_at <= now or (lease.holder, lease.holder_id) != (holder, holder_id):
            return

        def renewed(current: Body | None) -> Body | None:
            still, _ = parse(current) if current is not None else (None, None)
            if current is None or still is None or (still.holder, still.holder_id) != (holder, holder_id):
                return None
            return {**current, "spec": {**current["spec"], "renewTime": _micro(now)}}

        try:
            await self._write(namespace, device, renewed)
        except ApiError as err:
            log.warning("could not renew the lease of %s/%s: %s", namespace, device, err)

    async def release(self, namespace: str, device: str, holder: str, holder_id: str | None) -> bool:
        """End the holder's lease; False when it held none."""
        lease, _ = self.guard(namespace, device)
        if lease is None or (lease.holder, lease.holder_id) != (holder, holder_id):
            return False
        return await self._delete(namespace, device)

    async def break_(self, namespace: str, device: str, by: str, reason: str) -> Lease | None:
        """A person ends whoever's lease at once; the former holder's calls are told so until it would have expired.
        The lease that was broken, or None when there was none."""
        now = self._clock()
        broken: list[Lease] = []

        def tombstone(current: Body | None) -> Body | None:
            lease, _ = parse(current) if current is not None else (None, None)
            if current is None or lease is None or lease.expires_at <= now:
                return None
            broken.append(lease)
            annotations = {**current["metadata"].get("annotations", {}), BROKEN_BY: by,
                           BROKEN_REASON: reason[:512], BROKEN_AT: _micro(now)}
            return {**current, "metadata": {**current["metadata"], "annotations": annotations},
                    "spec": {**current["spec"], "holderIdentity": None}}

        await self._write(namespace, device, tombstone)
        return broken[0] if broken else None

    async def _write(self, namespace: str, device: str, change: Callable[[Body | None], Body | None]) -> Body | None:
        """Read the Lease, let `change` say what it becomes (None: leave it), write it with the version read."""
        path = path_of("coordination.k8s.io", "v1", "leases", namespace, lease_name(device))
        for _ in range(WRITE_ATTEMPTS):
            try:
                current: Body | None = await self.api.request("GET", path)
            except ApiError as err:
                if err.status != 404:
                    raise
                current = None
            wanted = change(current)
            if wanted is None:
                return current
            try:
                if current is None:
                    written = await self.api.request("POST", path_of("coordination.k8s.io", "v1", "leases", namespace),
                                                     body=wanted)
                else:
                    wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    written = await self.api.request("PUT", path, body=wanted)
            except ApiError as err:
                if err.status == 409:
                    continue  # someone else wrote it since: decide again on what is there now
                raise
            self._on_event("MODIFIED", written)
            return written
        raise ApiError(409, f"the Lease of {namespace}/{device} kept changing while it was written")

    async def _delete(self, namespace: str, device: str, resource_version: str | None = None) -> bool:
        path = path_of("coordination.k8s.io", "v1", "leases", namespace, lease_name(device))
        body = {"preconditions": {"resourceVersion": resource_version}} if resource_version else None
        try:
            await self.api.request("DELETE", path, body=body)
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        self._objects.pop((namespace, device), None)
        self._on_change(namespace, device)
        return True

    async def _sweep(self) -> None:
        """Expired leases (and tombstones past their time) go, so that `kubectl get leases` shows the truth."""
        while True:
            await asyncio.sleep(EXPIRY_SWEEP_S)
            now = self._clock()
            for (namespace, device), body in list(self._objects.items()):
                lease, broken = parse(body)
                ends = lease.expires_at if lease is not None else broken.until if broken is not None else now
                if ends <= now:
                    try:
                        await self._delete(namespace, device, body["metadata"].get("resourceVersion"))
                    except ApiError as err:
                        log.warning("could not delete the expired lease of %s/%s: %s", namespace, device, err)


def parse(body: Body) -> tuple[Lease | None, Broken | None]:
    """The lease a Lease object holds now (None once broken), and the broken one it remembers."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    annotations = meta.get("annotations") or {}
    renewed = _time(spec.get("renewTime")) or _time(spec.get("acquireTime"))
    if renewed is None:
        return None, None
    until = renewed + timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    holder, holder_id = annotations.get(HOLDER, ""), annotations.get(HOLDER_ID) or None
    # The holder's and the breaker's words reach other agents in their refusals: made safe as they are read.
    reason = written_text(annotations.get(REASON, ""))
    if annotations.get(BROKEN_BY):
        return None, Broken(holder, holder_id, annotations[BROKEN_BY], written_text(annotations.get(BROKEN_REASON, "")),
                            _time(annotations.get(BROKEN_AT)) or renewed, until)
    if not spec.get("holderIdentity") or not holder:
        return None, None
    return Lease(holder, until, reason, holder_id), None


def _lease_body(namespace: str, device: str, holder: str, holder_id: str | None, ttl_s: int, reason: str,
                acquired: str, now: datetime) -> Body:
    identity = f"{holder}/{holder_id}" if holder_id else holder
    annotations: dict[str, Any] = {HOLDER: holder, REASON: reason[:512]}
    if holder_id:
        annotations[HOLDER_ID] = holder_id
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": lease_name(device), "namespace": namespace, "labels": {LABEL: device},
                     "annotations": annotations},
        "spec": {"holderIdentity": identity[:1024], "leaseDurationSeconds": ttl_s, "acquireTime": acquired,
                 "renewTime": _micro(now)},
    }


def _micro(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
