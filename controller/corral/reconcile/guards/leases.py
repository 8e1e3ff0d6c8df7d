"""Device leases: exclusive control, kept as `coordination.k8s.io/v1` Lease objects that only the controller writes.

The object's words (name, label, annotations) and the bodies written are api/lease.py's; what one holds now
is decide/leases.py's. A lease has expired when renewTime + TTL has passed (judged when deciding, and the object
is then deleted); one a person broke keeps who broke it, when and why (so the former holder's next call can say
so) until it would have expired. Writes carry the resourceVersion they were decided on: two holders racing for one
Device cannot both get it. The objects survive a controller restart; agents have no rights on them (`kubectl get
leases`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import ValidationError

from corral.api.lease import (
    GROUP,
    LABEL,
    PLURAL,
    VERSION,
    LeaseObject,
    lease_body,
    lease_name,
    micro,
    renewed,
    tombstone,
    versioned,
)
from corral.decide.decision import Broken, Lease
from corral.decide.leases import parse
from corral.kube.client import ApiError, AsyncApi, path_of
from corral.kube.informer import Informer
from corral.kube.tasks import cancel_all
from corral.kube.typed import Body, problems_of

log = logging.getLogger(__name__)

EXPIRY_SWEEP_S = 5.0
WRITE_ATTEMPTS = 5

# What a write makes of the Lease as it is now (None: there is none): the object to write, or None to leave it.
Change = Callable[[Body | None, LeaseObject | None], Body | None]


class LeaseTaken(Exception):
    """Another holder has it (message: who, why, until when)."""


class Leases:
    def __init__(self, api: AsyncApi, namespaces: tuple[str, ...],
                 on_change: Callable[[str, str], None] = lambda namespace, device: None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api = api
        self._objects: dict[tuple[str, str], LeaseObject] = {}  # (namespace, device) -> its Lease
        self.on_change = on_change  # the Device whose lease changed (the controller queues it)
        self._clock = clock
        self.informer = Informer(api, GROUP, VERSION, PLURAL, LABEL, namespaces, self._on_event)
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
        try:
            obj = LeaseObject.model_validate(body)
        except ValidationError as err:  # Kubernetes' schema, so hardly ever; then it holds nothing Corral can read
            log.warning("a Lease with label %s could not be read: %s", LABEL, "; ".join(problems_of(err)))
            return
        if not obj.device:
            return
        key = (obj.metadata.namespace or "", obj.device)
        if kind == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self.on_change(*key)

    # ---- what guards an Intent --------------------------------------------------------------------------------

    def guard(self, namespace: str, device: str) -> tuple[Lease | None, Broken | None]:
        obj = self._objects.get((namespace, device))
        return (None, None) if obj is None else parse(obj)

    def held(self, namespace: str) -> list[tuple[str, Lease]]:
        """The Devices of the namespace (all namespaces: "") under a lease now, with it."""
        now = self._clock()
        found = []
        for (ns, device), obj in sorted(self._objects.items(), key=lambda item: item[0]):
            lease, _ = parse(obj)
            if (not namespace or ns == namespace) and lease is not None and lease.expires_at > now:
                found.append((f"{ns}/{device}", lease))
        return found

    # ---- writes -----------------------------------------------------------------------------------------------

    async def acquire(self, namespace: str, device: str, holder: str, holder_id: str | None, ttl_s: int,
                      reason: str) -> Lease:
        """Take (or renew) the Device's lease for this holder; LeaseTaken when another holds it."""
        now = self._clock()

        def take(_current: Body | None, obj: LeaseObject | None) -> Body | None:
            lease, _ = parse(obj) if obj is not None else (None, None)
            if lease is not None and lease.expires_at > now and (lease.holder, lease.holder_id) != (holder, holder_id):
                raise LeaseTaken(f"Device {device} is leased to {lease.who()}"
                                 + (f" ({lease.reason})" if lease.reason else "")
                                 + f" until {lease.expires_at:%H:%M:%S} UTC.")
            kept = obj is not None and lease is not None and lease.expires_at > now
            acquired = obj.spec.acquire_time if kept and obj is not None else None
            return lease_body(namespace, device, holder, holder_id, ttl_s, reason, acquired or micro(now), now)

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

        def renew(current: Body | None, obj: LeaseObject | None) -> Body | None:
            still, _ = parse(obj) if obj is not None else (None, None)
            if current is None or still is None or (still.holder, still.holder_id) != (holder, holder_id):
                return None
            return renewed(current, now)

        try:
            await self._write(namespace, device, renew)
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

        def end(current: Body | None, obj: LeaseObject | None) -> Body | None:
            lease, _ = parse(obj) if obj is not None else (None, None)
            if current is None or lease is None or lease.expires_at <= now:
                return None
            broken.append(lease)
            return tombstone(current, by, reason, now)

        await self._write(namespace, device, end)
        return broken[0] if broken else None

    async def _write(self, namespace: str, device: str, change: Change) -> Body | None:
        """Read the Lease, let `change` say what it becomes (None: leave it), write it with the version read."""
        path = path_of(GROUP, VERSION, PLURAL, namespace, lease_name(device))
        for _ in range(WRITE_ATTEMPTS):
            try:
                current: Body | None = await self.api.request("GET", path)
            except ApiError as err:
                if err.status != 404:
                    raise
                current = None
            read = LeaseObject.model_validate(current) if current is not None else None
            wanted = change(current, read)
            if wanted is None:
                return current
            try:
                if read is None:
                    written = await self.api.request("POST", path_of(GROUP, VERSION, PLURAL, namespace), body=wanted)
                else:
                    written = await self.api.request("PUT", path, body=versioned(wanted, read.metadata.resource_version))
            except ApiError as err:
                if err.status == 409:
                    continue  # someone else wrote it since: decide again on what is there now
                raise
            self._on_event("MODIFIED", written)
            return written
        raise ApiError(409, f"the Lease of {namespace}/{device} kept changing while it was written")

    async def _delete(self, namespace: str, device: str, resource_version: str | None = None) -> bool:
        path = path_of(GROUP, VERSION, PLURAL, namespace, lease_name(device))
        body = {"preconditions": {"resourceVersion": resource_version}} if resource_version else None
        try:
            await self.api.request("DELETE", path, body=body)
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        self._objects.pop((namespace, device), None)
        self.on_change(namespace, device)
        return True

    async def _sweep(self) -> None:
        """Expired leases (and tombstones past their time) go, so that `kubectl get leases` shows the truth."""
        while True:
            await asyncio.sleep(EXPIRY_SWEEP_S)
            now = self._clock()
            for (namespace, device), obj in list(self._objects.items()):
                lease, broken = parse(obj)
                ends = lease.expires_at if lease is not None else broken.until if broken is not None else now
                if ends <= now:
                    try:
                        await self._delete(namespace, device, obj.metadata.resource_version)
                    except ApiError as err:
                        log.warning("could not delete the expired lease of %s/%s: %s", namespace, device, err)
