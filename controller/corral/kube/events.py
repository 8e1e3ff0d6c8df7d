"""Kubernetes Events (events.k8s.io/v1) for what a human should see, posted off the event loop.

An Event names the object it is about, a CamelCase reason, the action taken
and a note. Notes are capped at the API's 1 KiB; what is cut is said.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from corral.kube.client import ApiError
from corral.kube.correlate import EventCorrelator, EventKey
from corral.obs import metrics

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "corral.dev/controller"
NOTE_LIMIT = 1024


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None
    uid: str | None

    def as_dict(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


def event_body(
    regarding: ObjectRef,
    reason: str,
    action: str,
    note: str,
    type_: Literal["Normal", "Warning"],
    instance: str,
    now: datetime,
    related: ObjectRef | None = None,
) -> dict[str, object]:
    if len(note) > NOTE_LIMIT:
        note = note[: NOTE_LIMIT - 20] + " … (truncated)"
    namespace = regarding.namespace or "default"
    body: dict[str, object] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{regarding.name}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "regarding": regarding.as_dict(),
        "reason": reason,
        "action": action,
        "note": note,
        "type": type_,
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
    }
    if related is not None:
        body["related"] = related.as_dict()
    return body


class EventRecorder:
    """Posts Events in the order they happen, from a queue of its own.

    Events are for people; the work they describe must not wait for them. `post()` stamps the Event
    and queues it; one worker sends them in order. When the API server is slow and the queue is full,
    the oldest waiting Events are dropped (with a log line), never the work. `close()` sends what is
    queued before the controller exits.
    """

    def __init__(self, send: Callable[[str, dict[str, Any]], Awaitable[None]], instance: str | None = None,
                 max_queued: int = 10_000, correlator: EventCorrelator | None = None) -> None:
        self._send = send  # (namespace, Event body): creates it, off the event loop
        # As the kubelet's recorder: similar Events combined, and a token bucket per object and reason.
        self.correlator = correlator if correlator is not None else EventCorrelator()
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}"
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(max_queued)
        self._worker: asyncio.Task[None] | None = None
        self.dropped = 0

    def post(
        self,
        regarding: ObjectRef,
        reason: str,
        action: str,
        note: str,
        type_: Literal["Normal", "Warning"] = "Normal",
        related: ObjectRef | None = None,
    ) -> None:
        """Stamp the Event and queue it; call on the event loop. Nothing waits for the API server. An object
        that has had too many Events lately gets none (kube.correlate): the audit log keeps the facts."""
        key = EventKey(regarding.kind, regarding.namespace, regarding.name, regarding.uid, reason, type_)
        correlated = self.correlator.correlate(key, note, time.monotonic())
        if correlated is None:
            metrics.EVENTS_SKIPPED.inc()
            return
        note = correlated
        body = event_body(regarding, reason, action, note, type_, self.instance, datetime.now(UTC), related)
        if self._queue.full():
            self._queue.get_nowait()
            self._queue.task_done()
            self.dropped += 1
            log.warning("Event queue full: dropped the oldest waiting Event (%d so far)", self.dropped)
        self._queue.put_nowait(body)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._send_all(), name="corral-events")

    async def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (for at most timeout_s), then stop."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout_s)
        except TimeoutError:
            log.warning("%d Events were not posted before exit", self._queue.qsize())
        if self._worker is not None:
            self._worker.cancel()

    async def _send_all(self) -> None:
        while True:
            body = await self._queue.get()
            try:
                await self._send(body["metadata"]["namespace"], body)
            except ApiError as err:
                # An Event that cannot be posted must not stop the work it describes.
                log.warning("could not post Event %s on %s/%s: %s", body["reason"], body["regarding"]["kind"],
                            body["regarding"]["name"], err)
            except Exception:
                log.exception("could not post Event %s", body["reason"])
            finally:
                self._queue.task_done()
