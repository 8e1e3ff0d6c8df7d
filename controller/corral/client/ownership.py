"""Who a Secret made at run time belongs to: the ServiceAccount the making step runs as, and what becomes of a
reference to a previous ServiceAccount of the same name.

The chart's ServiceAccount is deleted by `helm uninstall` and made again, under the same name but with a new
uid, by the next install. Kubernetes' garbage collector then deletes every object whose references all point at
owners that are gone, and it recognises an owner by uid: an object still naming the old uid is garbage, however
alive a ServiceAccount of that name is. It does so some seconds after the uninstall, so an install under the
same name can start first, find the old Secrets, hand them to its pods, and lose them a moment later.

So a step that finds its objects re-points them: the reference to the old ServiceAccount is replaced by one to
the live one in the same update that carries the resourceVersion it read. That is enough against the collector,
as its source says (k8s.io/kubernetes v1.36.3, pkg/controller/garbagecollector, `attemptToDeleteItem` and
`deleteObject`): it reads the object, deletes only when NONE of its owners is there (each checked by a GET of
the owner's name and a comparison of uids), and deletes with both a uid and a resourceVersion precondition; on
a conflict it deletes anyway only when the ownerReferences are unchanged, otherwise it starts again from the
object as it is now, which names the live owner. Either our update lands first (the collector's delete is then
refused and it finds a live owner) or its delete does (our update is then refused with 404 and the Secret is
made anew): never a Secret handed out and then deleted.

A Secret kept past an uninstall (`--keep`) loses such references instead, old or live: it must not go with
either ServiceAccount. One with no reference to a ServiceAccount of this name is not adopted: someone made it
without one, and it stays theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Owner:
    """The object the made Secrets belong to (garbage-collected with it): a ServiceAccount in their namespace."""

    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        # No blockOwnerDeletion: it would need the right to set finalizers on the ServiceAccount.
        return {"apiVersion": "v1", "kind": "ServiceAccount", "name": self.name, "uid": self.uid}

    def names(self, reference: dict[str, Any]) -> bool:
        """True when `reference` is to a ServiceAccount of this name, this one or a previous one."""
        return (reference.get("apiVersion"), reference.get("kind"), reference.get("name")) == (
            "v1", "ServiceAccount", self.name)


def settled_references(current: list[dict[str, Any]], owner: Owner | None, keep: bool) -> list[dict[str, Any]] | None:
    """The ownerReferences an existing object should carry (API form), or None when `current` is right as it is.

    `owner` None (the step does not run as a ServiceAccount of the namespace) changes nothing. With `keep`, every
    reference to a ServiceAccount of the owner's name goes; otherwise such references become exactly one, to the
    live owner. References to anything else stay as they are, in their order."""
    if owner is None:
        return None
    ours = [ref for ref in current if owner.names(ref)]
    if not ours:
        return None
    others = [ref for ref in current if not owner.names(ref)]
    if keep:
        return others
    if len(ours) == 1 and ours[0].get("uid") == owner.uid:
        return None
    return [*others, owner.reference()]
