"""Kubernetes Events (events.k8s.io/v1) for what a human should see, posted off the event loop.

An Event names the object it is about, a CamelCase reason, the action taken
and a note. Notes are capped at the API's 1 KiB; what is cut is said.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import kubernetes

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
) -> dict[str, object]:
    if len(note) > NOTE_LIMIT:
        note = note[: NOTE_LIMIT - 20] + " … (truncated)"
    namespace = regarding.namespace or "default"
    return {
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


class EventRecorder:
    def __init__(self, api_client: kubernetes.client.ApiClient, instance: str | None = None) -> None:
        self._events = kubernetes.client.EventsV1Api(api_client)
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}"

    async def post(
        self,
        regarding: ObjectRef,
        reason: str,
        action: str,
        note: str,
        type_: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        body = event_body(regarding, reason, action, note, type_, self.instance, datetime.now(UTC))
        try:
            await asyncio.to_thread(self._events.create_namespaced_event, body["metadata"]["namespace"], body)  # type: ignore[index]
        except kubernetes.client.ApiException as err:
            # An Event that cannot be posted must not stop the work it describes.
            log.warning("could not post Event %s on %s/%s: %s", reason, regarding.kind, regarding.name, err.reason)
