"""What the broker account keeper refused of a bridge or source Secret, told to people (issue 41, finding 3).

A refused Secret makes nothing at the broker; the person who wrote it (or who should know someone did) learns why
from a Warning Event on the Secret itself, the controller's log, and an audit record `bridge.refused`. Each is told
once per Secret (its uid) and reason: the keeper re-plans every second while Devices change, and a Secret that keeps
being refused is one fact.
"""

from __future__ import annotations

import logging

from corral.kube.cache import Key
from corral.kube.events import ObjectRef
from corral.kube.typed import Body
from corral.reconcile.devices.notices import DeviceNotices

log = logging.getLogger(__name__)

REASON = "BridgeSecretRefused"
FACT = "bridge.refused"


class SecretRefusals:
    def __init__(self, notices: DeviceNotices) -> None:
        self.notices = notices
        self._uids: dict[Key, str] = {}
        self._told: set[tuple[Key | None, str, str]] = set()

    def seen(self, key: Key, body: Body | None) -> None:
        """The Secret as last heard (None: deleted), for the uid its Event names."""
        if body is None:
            self._uids.pop(key, None)
        else:
            self._uids[key] = str((body.get("metadata") or {}).get("uid") or "")

    def tell(self, why: str, secret: Key | None) -> None:
        uid = self._uids.get(secret, "") if secret is not None else ""
        if (secret, uid, why) in self._told:
            return
        self._told.add((secret, uid, why))
        log.warning("broker accounts: %s", why)
        if secret is None:
            return
        namespace, name = secret
        self.notices.recorder.post(ObjectRef("v1", "Secret", name, namespace, uid or None), REASON, "Refuse",
                                   f"Secret {namespace}/{name} refused: {why}", "Warning")
        if self.notices.audit is not None:
            self.notices.audit.note(FACT, f"{namespace}/{name}", {"secret": f"{namespace}/{name}", "reason": why},
                                    uid=uid or None)
