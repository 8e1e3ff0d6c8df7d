"""The controller's calls to Kubernetes: server-side apply with named field managers, on the event loop.

Every call goes through `kube.client` (asynchronous HTTP with a connection pool), so no reconcile
ever blocks the loop or waits for a thread. Status goes through the status subresource; each write is
counted by reason, because "no write when nothing changed" is a promise that tests measure. Writes
return the object the API server answered with, so the caller can put it into its cache at once
instead of waiting for the watch to bring it.
"""

from __future__ import annotations

from typing import Any

import kubernetes

from corral.api.codes import (
    API_VERSION,
    CONTROLLER_MANAGER,
    GROUP,
    INTENT_ANNOTATION,
    INTENTS_MANAGER,
    OVERLAY_MANAGER,
    VERSION,
)
from corral.kube.client import APPLY, MERGE, ApiError, AsyncApi, path_of
from corral.kube.typed import Body
from corral.obs import metrics


class FieldConflict(Exception):
    """Server-side apply refused: another field manager owns the field."""


class Kube:
    def __init__(self, config: kubernetes.client.Configuration, connections: int = 32) -> None:
        self.api = AsyncApi(config, connections=connections)

    async def close(self) -> None:
        await self.api.close()

    # ---- reads ----------------------------------------------------------------------------------------------

    async def list_objects(self, plural: str, namespaces: tuple[str, ...]) -> list[Body]:
        if not namespaces:
            return list((await self.api.request("GET", path_of(GROUP, VERSION, plural)))["items"])
        items: list[Body] = []
        for namespace in namespaces:
            items += (await self.api.request("GET", path_of(GROUP, VERSION, plural, namespace)))["items"]
        return items

    async def list_capabilities(self) -> list[Body]:
        return list((await self.api.request("GET", path_of(GROUP, VERSION, "capabilities")))["items"])

    async def get_device(self, namespace: str, name: str) -> Body:
        return await self.api.request("GET", path_of(GROUP, VERSION, "devices", namespace, name))

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        secret = await self.api.request("GET", path_of("", "v1", "secrets", namespace, name))
        return dict(secret.get("data") or {})

    async def may(self, user: str, groups: list[str], verb: str, namespace: str | None, device: str | None) -> bool:
        """SubjectAccessReview: may `user` do `verb` on devices/`device` (group corral.dev) in `namespace`?
        None for either: on any device (there), or in every namespace."""
        attributes = {"group": GROUP, "resource": "devices", "verb": verb}
        if namespace:
            attributes["namespace"] = namespace
        if device:
            attributes["name"] = device
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        }
        answer = await self.api.request("POST", path_of("authorization.k8s.io", "v1", "subjectaccessreviews"),
                                        body=review)
        return bool((answer.get("status") or {}).get("allowed"))

    # ---- writes ---------------------------------------------------------------------------------------------

    async def create_capability(self, body: Body) -> bool:
        """Create it; False if it already exists (identical content, since the name is the hash)."""
        try:
            await self.api.request("POST", path_of(GROUP, VERSION, "capabilities"), body=body,
                                   params={"fieldManager": CONTROLLER_MANAGER})
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def delete_capability(self, name: str, uid: str, resource_version: str) -> bool:
        """Delete it only as it was when last seen (the uid and version): False when it was changed or is gone."""
        try:
            await self.api.request("DELETE", path_of(GROUP, VERSION, "capabilities", None, name),
                                   body={"preconditions": {"uid": uid, "resourceVersion": resource_version}})
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        return True

    async def apply_status(self, plural: str, namespace: str, name: str, kind: str, status: dict[str, Any],
                           reason: str) -> Body:
        """Server-side apply of the whole status as `corral-controller`; the object as the server now has it."""
        body = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "status": status}
        written = await self.api.request("PATCH", path_of(GROUP, VERSION, plural, namespace, name, "status"),
                                         body=body, content_type=APPLY,
                                         params={"fieldManager": CONTROLLER_MANAGER, "force": "true"})
        metrics.STATUS_WRITES.labels(reason=reason).inc()
        return written

    async def apply_intent_target(self, namespace: str, device: str, target: dict[str, Any], intent: str) -> Body:
        """Apply spec.target as `corral-intents`, without force: a field another manager owns is a FieldConflict."""
        body = {
            "apiVersion": API_VERSION,
            "kind": "Device",
            "metadata": {"name": device, "annotations": {INTENT_ANNOTATION: intent}},
            "spec": {"target": target},
        }
        try:
            return await self.api.request("PATCH", path_of(GROUP, VERSION, "devices", namespace, device), body=body,
                                          content_type=APPLY, params={"fieldManager": INTENTS_MANAGER})
        except ApiError as err:
            if err.status == 409 and any(c.get("reason") == "FieldManagerConflict" for c in err.causes()):
                raise FieldConflict(err.message) from None
            raise

    async def patch_overlay(self, namespace: str, device: str, field: str, text: str) -> Body:
        """One overlay field as `corral-overlay`, by merge patch: empty text deletes it. Overlay text is people's
        data, last writer wins; a merge patch leaves the other overlay fields (whoever set them) alone."""
        return await self.api.request("PATCH", path_of(GROUP, VERSION, "devices", namespace, device),
                                      body={"spec": {"overlay": {field: text or None}}}, content_type=MERGE,
                                      params={"fieldManager": OVERLAY_MANAGER})

    async def delete_intent(self, namespace: str, name: str, uid: str) -> None:
        try:
            await self.api.request("DELETE", path_of(GROUP, VERSION, "intents", namespace, name),
                                   body={"preconditions": {"uid": uid}})
        except ApiError as err:
            if err.status not in (404, 409):
                raise

    async def create_event(self, namespace: str, body: Body) -> None:
        await self.api.request("POST", path_of("events.k8s.io", "v1", "events", namespace), body=body)
