"""A new Intent under a name used within the idempotency window: answered from the audit log, never run again.

The client answers a replay itself while the earlier Intent exists (its create meets the name). Once that
Intent is deleted after its retention, the create succeeds, and the controller is the one that knows: an
Intent it has not decided whose namespace/name the audit index (audit.requests) holds under another UID ends
DEDUP when it asks for the same thing (naming the earlier outcome), or DENY_ID_CONFLICT when it asks for
something else. It is not decided on its merits and nothing is executed; its answer is a decision record of
its own, which names the earlier Intent and leaves the index's entry as it was.
"""

from __future__ import annotations

from datetime import UTC, datetime

from corral.audit.requests import REPLAY_OF, Earlier, RequestNames
from corral.decide.idempotency import identity_hash
from corral.kube.workqueue import Result
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.intents.facts import StoredIntent, name_of, spec_body, uid_of
from corral.reconcile.intents.outcomes import Outcomes


class Replays:
    def __init__(self, names: RequestNames, outcomes: Outcomes) -> None:
        self.names = names
        self.outcomes = outcomes

    async def answer(self, intent: StoredIntent, view: DeviceView | None) -> Result | None:
        """The Intent's final answer if it replays a name used within the window; None if it is a new request."""
        earlier = self.names.earlier(name_of(intent), uid_of(intent), datetime.now(UTC))
        if earlier is None:
            return None
        noted = {REPLAY_OF: earlier.uid}
        when = _at(earlier)
        if identity_hash(spec_body(intent)) == earlier.identity:
            return await self.outcomes.finish(intent, view, "DEDUP", f"Same request as before: {earlier.code} at "
                                              f"{when}; not run again.",
                                              {"before": earlier.before, "after": earlier.after}, noted)
        return await self.outcomes.finish(
            intent, view, "DENY_ID_CONFLICT",
            f"Intent {intent.metadata.name} was used for a different request ({earlier.code} at {when}); use a new "
            "request_id for a new request.", {}, noted)


def _at(earlier: Earlier) -> str:
    return earlier.decided_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
