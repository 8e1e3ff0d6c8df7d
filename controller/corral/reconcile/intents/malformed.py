"""Intents the controller cannot read: said on the Intent (condition Valid=False, reason Malformed) and in a
Warning Event, once, and never decided.

An Intent enters as a `StoredIntent` (facts.py). One its model refuses (which the API server's schema should
not have let through) is kept out of the Intent cache, so nothing acts on a version that cannot be read; its
key still reaches the reconciler, which tells the object's readers why nothing happens. This is the one place
that reads an Intent as the raw body it came as: there is no model of it to read.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from corral.api.base import Condition, ObjectMeta
from corral.api.codes import API_VERSION
from corral.kube.cache import Key
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.objects import Kube
from corral.kube.typed import Body, Malformed
from corral.kube.workqueue import Result

log = logging.getLogger(__name__)

CONDITION = "Valid"
REASON = "Malformed"


def meta_of(body: Body) -> ObjectMeta:
    """The object's metadata, which every body has (unknown fields kept)."""
    return ObjectMeta.model_validate(body.get("metadata") or {})


class MalformedIntents:
    """The Intents that arrived malformed, by key, until a readable version or their deletion replaces them."""

    def __init__(self, kube: Kube, recorder: EventRecorder) -> None:
        self.kube = kube
        self.recorder = recorder
        self._found: dict[Key, tuple[Body, Malformed]] = {}

    def note(self, key: Key, body: Body, problem: Malformed) -> None:
        log.warning("%s", problem)
        self._found[key] = (body, problem)

    def forget(self, key: Key) -> None:
        self._found.pop(key, None)

    async def tell(self, key: Key) -> Result:
        """Say on the Intent why it is not decided (once: nothing is written when it says so already)."""
        found = self._found.get(key)
        if found is None:
            return Result.done()
        body, problem = found
        message = (f"Not decided: this Intent is malformed ({'; '.join(problem.problems)}). Corral acts on no Intent "
                   "it cannot read; create a valid one.")
        status: dict[str, Any] = dict(body.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
        if any(c.get("type") == CONDITION and c.get("message") == message for c in conditions):
            return Result.done()
        meta = meta_of(body)
        self.recorder.post(ObjectRef(API_VERSION, "Intent", meta.name or "", meta.namespace, meta.uid), REASON,
                           "Decide", message, "Warning")
        condition = Condition(type=CONDITION, status="False", reason=REASON, message=message,
                              last_transition_time=datetime.now(UTC).replace(microsecond=0),
                              observed_generation=meta.generation)
        status["conditions"] = [c for c in conditions if c.get("type") != CONDITION] + [
            condition.model_dump(mode="json", by_alias=True, exclude_none=True)]
        try:
            await self.kube.apply_status("intents", meta.namespace or "", meta.name or "", "Intent", status,
                                         "malformed")
        except ApiError as err:
            log.warning("could not say on Intent %s/%s that it is malformed: %s", meta.namespace, meta.name, err)
        return Result.done()
