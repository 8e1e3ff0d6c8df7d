"""One `coordination.k8s.io/v1` Lease, held the way client-go holds it, on the event loop.

A port of client-go's `tools/leaderelection/leaderelection.go` (kubernetes/client-go at 32ce75a7, July 2026):
`tryAcquireOrRenew` (the holder's optimistic fast path; otherwise GET, CREATE when missing, and an UPDATE with
the observed resourceVersion as precondition), `isLeaseValid` (a record is another's while it has not changed for
its leaseDurationSeconds on OUR monotonic clock, never compared with the wall clock of whoever wrote it),
`tryRelease` (holder cleared, leaseDurationSeconds 1) and `resourcelock/leaselock.go`'s record <-> LeaseSpec.

Where this differs, and why:
- A 409 Conflict is a lost race, not an error: someone else wrote the Lease first; the next round sees who.
- `valid_until` is the fence the holder checks before every effect: the monotonic time taken BEFORE the last
  successful acquire/renew request was sent, plus the renew deadline. A taker waits a lease duration from when it
  saw that record, which it can only have seen after the request was sent, so the holder stops first.
- The epoch (fencing token carried in commands) is the acquireTime in ms. A new holder writes
  max(its wall clock, the previous acquireTime + 1 ms), so the token grows with every holder even when the
  replicas' wall clocks disagree (a release writes its own acquireTime, which counts as previous too).
- The observed record can be fed from a LIST (`observe`), so a replica holding many shards reads them all in one
  request instead of one GET each; the UPDATE's precondition keeps that as safe as a GET.
- A Lease naming this process that it no longer holds (its renew deadline passed) is taken back as a new
  acquisition (new acquireTime, leaseTransitions + 1): work stopped at the deadline, so it starts again as new.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.kube.client import ApiError, AsyncApi, path_of
from corral.kube.typed import Body

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "coordination.k8s.io", "v1", "leases"
MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # metav1.MicroTime on the wire (RFC 3339, microseconds, UTC)
PREFIX_LABEL = "corral.dev/lease-prefix"  # on every Lease Corral creates, so one LIST finds a fleet's Leases

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

T = TypeVar("T")
Clock = Callable[[], float]
WallClock = Callable[[], datetime]


def prefix_label(prefix: str) -> str:
    """The value of the prefix label: the prefix itself when it is a valid label value (at most 63 characters),
    else a digest of it (a long release name makes a long prefix; the Lease names may be 253 long, labels not)."""
    if _LABEL_VALUE.match(prefix):
        return prefix
    return "sha256-" + hashlib.sha256(prefix.encode()).hexdigest()[:48]


def parse_microtime(value: str) -> datetime:
    """A Lease's acquireTime/renewTime. The API server always writes MicroTime with six digits and Z; a value
    written some other RFC 3339 way (fewer digits, an offset) is read too, since other tools write Leases."""
    try:
        return datetime.strptime(value, MICROTIME).replace(tzinfo=UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not a MicroTime (expected like 2026-01-02T03:04:05.123456Z): {value!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"MicroTime without a time zone (expected a trailing Z or an offset): {value!r}")
    return parsed.astimezone(UTC)


def format_microtime(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError(f"a MicroTime needs an aware datetime, got naive {moment!r}")
    return moment.astimezone(UTC).strftime(MICROTIME)


def epoch_ms(moment: datetime) -> int:
    """Whole milliseconds since the Unix epoch, exact (no float rounding)."""
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def from_epoch_ms(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


class LeaseRecord(BaseModel):
    """client-go's LeaderElectionRecord: the Lease's spec, typed. Compared whole to see whether it changed."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    holder: str = Field("", alias="holderIdentity")
    lease_duration_s: int = Field(0, alias="leaseDurationSeconds", ge=0)
    acquire_time: datetime | None = Field(None, alias="acquireTime")
    renew_time: datetime | None = Field(None, alias="renewTime")
    transitions: int = Field(0, alias="leaseTransitions", ge=0)

    @field_validator("holder", mode="before")
    @classmethod
    def _no_holder(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("acquire_time", "renew_time", mode="before")
    @classmethod
    def _microtime(cls, value: Any) -> Any:
        return parse_microtime(value) if isinstance(value, str) else value

    def spec(self) -> Body:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": format_microtime(self.acquire_time) if self.acquire_time else None,
            "renewTime": format_microtime(self.renew_time) if self.renew_time else None,
            "leaseTransitions": self.transitions,
        }


def record_of(lease: Body) -> LeaseRecord:
    return LeaseRecord.model_validate(lease.get("spec") or {})


class LeaseElector:
    """One Lease, for one identity. Not safe to drive from two tasks at once (one loop drives it)."""

    def __init__(self, api: AsyncApi, namespace: str, name: str, identity: str, *, lease_duration_s: float,
                 renew_deadline_s: float, labels: Mapping[str, str] | None = None, clock: Clock = time.monotonic,
                 wall: WallClock | None = None) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.labels = dict(labels or {})
        self._clock = clock
        self._wall = wall or (lambda: datetime.now(UTC))
        self._lease: Body | None = None  # the last object read or written: its resourceVersion is the precondition
        self._missing = False  # the last read found no Lease: create it
        self.observed: LeaseRecord | None = None
        self.observed_at = float("-inf")  # monotonic time the observed record was first seen as it is
        self.holding = False  # this process counts the Lease as its own (acquired, not released, not lost)
        self.valid_until = float("-inf")
        self.epoch: int | None = None

    # ---- what the holder and the plan read ------------------------------------------------------------------

    def valid(self, now: float | None = None) -> bool:
        """Holding, and within the renew deadline of the last successful renewal: the fence, checked each time."""
        return self.holding and (self._clock() if now is None else now) < self.valid_until

    def lease_valid(self, now: float | None = None) -> bool:
        """client-go's isLeaseValid: the observed record is still its holder's by our clock."""
        if self.observed is None:
            return False
        now = self._clock() if now is None else now
        return now < self.observed_at + self.observed.lease_duration_s

    def is_leader(self) -> bool:
        """client-go's IsLeader: the last record seen or written names this identity."""
        return self.observed is not None and self.observed.holder == self.identity

    @property
    def missing(self) -> bool:
        """The last read found no Lease (deleted under its holder, or never made)."""
        return self._missing

    def drop(self) -> None:
        """Stop counting the Lease as this process's (its renew deadline passed, or another holds it now)."""
        self.holding = False
        self.valid_until = float("-inf")
        self.epoch = None

    # ---- observing ------------------------------------------------------------------------------------------

    def observe(self, lease: Body | None) -> None:
        """A read of the Lease (a GET, or one item of a LIST); None: it does not exist."""
        if lease is None:
            self._lease, self._missing = None, True
            return
        self._lease, self._missing = lease, False
        record = record_of(lease)
        if record != self.observed:  # client-go compares the raw record: a renewal restarts the holder's time
            self._set_observed(record)

    def _set_observed(self, record: LeaseRecord) -> None:
        self.observed = record
        self.observed_at = self._clock()

    # ---- tryAcquireOrRenew ----------------------------------------------------------------------------------

    async def try_acquire_or_renew(self, *, read: bool = True, acquire: bool = True) -> bool:
        """One attempt; True when this process holds the Lease afterwards (and `valid_until` moved on).
        `read` False: trust the record last observed (fed from a LIST this round) instead of a GET.
        `acquire` False: renew only; a Lease this process no longer holds (released meanwhile) is left alone."""
        sent_at = self._clock()  # before any request: the fence must not outlast what the taker will wait
        now = self._wall()
        # 1. The fast path: the holder updates optimistically, assuming the record it saw last is current.
        if self.holding and self.is_leader() and self.lease_valid(sent_at) and self._lease is not None:
            assert self.observed is not None
            renewed = self.observed.model_copy(update={"renew_time": now,
                                                       "lease_duration_s": self._duration()})
            try:
                if await self._update(renewed):
                    return self._held(renewed, sent_at)
            except ApiError as err:  # as client-go: any refusal of the fast path falls back to reading (a 404 too)
                log.debug("Lease %s/%s: optimistic renewal refused (%s)", self.namespace, self.name, err)
            read = True
        # 2. Obtain or create the record.
        if read:
            try:
                self.observe(await self._request("GET", self._path()))
            except ApiError as err:
                if err.status != 404:
                    raise
                self.observe(None)
        if not acquire and not self.holding:
            return False
        if self._missing:
            if not acquire:
                return False
            created = LeaseRecord(holderIdentity=self.identity, leaseDurationSeconds=self._duration(),
                                  acquireTime=now, renewTime=now, leaseTransitions=0)
            if not await self._create(created):
                return False
            return self._acquired(created, sent_at)
        old = self.observed
        assert old is not None
        # 3. Held by another, and not yet expired by our clock: not ours to take.
        if old.holder and old.holder != self.identity and self.lease_valid(sent_at):
            return False
        # 4. Ours to renew (keeping acquireTime and transitions), or to take (a new acquireTime, transitions + 1).
        if self.holding and self.is_leader():
            record = LeaseRecord(holderIdentity=self.identity, leaseDurationSeconds=self._duration(),
                                 acquireTime=old.acquire_time or now, renewTime=now, leaseTransitions=old.transitions)
            if await self._update(record):
                return self._held(record, sent_at)
            return False
        if not acquire:
            return False
        acquired_at = now
        if old.acquire_time is not None and epoch_ms(now) <= epoch_ms(old.acquire_time):
            acquired_at = from_epoch_ms(epoch_ms(old.acquire_time) + 1)  # the token grows even if our clock is behind
        record = LeaseRecord(holderIdentity=self.identity, leaseDurationSeconds=self._duration(),
                             acquireTime=acquired_at, renewTime=now, leaseTransitions=old.transitions + 1)
        if await self._update(record):
            return self._acquired(record, sent_at)
        return False

    def _acquired(self, record: LeaseRecord, sent_at: float) -> bool:
        assert record.acquire_time is not None
        self.holding = True
        self.epoch = epoch_ms(record.acquire_time)
        return self._held(record, sent_at)

    def _held(self, record: LeaseRecord, sent_at: float) -> bool:
        self._set_observed(record)
        self.valid_until = sent_at + self.renew_deadline_s
        return True

    # ---- tryRelease -----------------------------------------------------------------------------------------

    async def release(self) -> bool:
        """Give the Lease up so a successor takes it at once. Stops counting it as held BEFORE the request: from
        the moment a successor can see it free, this process must already act on nothing."""
        was_holding = self.holding
        self.drop()
        for _ in range(3):  # client-go retries on a conflict (another write in between); bounded here
            try:
                self.observe(await self._request("GET", self._path()))
            except ApiError as err:
                if err.status == 404:
                    log.info("Lease %s/%s not found to release", self.namespace, self.name)
                    return False
                raise
            old = self.observed
            assert old is not None
            if old.holder != self.identity:
                return True
            now = self._wall()
            acquire = now
            if old.acquire_time is not None and epoch_ms(now) <= epoch_ms(old.acquire_time):
                acquire = from_epoch_ms(epoch_ms(old.acquire_time) + 1)
            record = LeaseRecord(holderIdentity="", leaseDurationSeconds=1, acquireTime=acquire, renewTime=now,
                                 leaseTransitions=old.transitions)
            if await self._update(record):
                self._set_observed(record)
                if was_holding:
                    log.debug("Lease %s/%s released by %s", self.namespace, self.name, self.identity)
                return True
        return False

    # ---- the requests ---------------------------------------------------------------------------------------

    def _duration(self) -> int:
        return max(1, round(self.lease_duration_s))

    def _path(self, name: bool = True) -> str:
        return path_of(GROUP, VERSION, PLURAL, self.namespace, self.name if name else None)

    def _metadata(self) -> Body:
        return {"name": self.name, "namespace": self.namespace, "labels": dict(self.labels)}

    async def _create(self, record: LeaseRecord) -> bool:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Lease", "metadata": self._metadata(),
                "spec": record.spec()}
        try:
            self._lease = await self._request("POST", self._path(name=False), body=body)
        except ApiError as err:
            if err.status == 409:  # AlreadyExists: another replica created it first
                self._missing = False
                return False
            raise
        self._missing = False
        return True

    async def _update(self, record: LeaseRecord) -> bool:
        """A PUT with the resourceVersion last seen: refused (409) if anyone wrote the Lease since."""
        assert self._lease is not None
        metadata = dict(self._lease.get("metadata") or {})
        metadata["labels"] = {**(metadata.get("labels") or {}), **self.labels}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Lease", "metadata": metadata, "spec": record.spec()}
        try:
            self._lease = await self._request("PUT", self._path(), body=body)
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def _request(self, method: str, path: str, body: Body | None = None) -> Body:
        # client-go bounds a renewal by the renew deadline; past it the answer is useless (the fence has closed).
        return await _bounded(self.api.request(method, path, body=body), self.renew_deadline_s)


async def _bounded(call: Awaitable[T], timeout_s: float) -> T:
    return await asyncio.wait_for(call, timeout_s)
