"""The controller's writes to Kubernetes: server-side apply with a named field manager, off the event loop.

The official client is synchronous, so every call runs in a worker thread.
Status goes through the status subresource; each write is counted by reason,
because "no write when nothing changed" is a promise that tests measure.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes

from corral.api.base import GROUP, VERSION
from corral.client.errors import api_message
from corral.obs import metrics

FIELD_MANAGER = "corral-controller"
# Executed Intents own the target fields they set, under their own name, so that
# a person's `kubectl apply --server-side` and an agent's Intent never overwrite
# each other silently: whoever comes second gets a conflict.
INTENTS_FIELD_MANAGER = "corral-intents"


class FieldConflict(Exception):
    """Server-side apply refused: another field manager owns the field."""
_APPLY = "application/apply-patch+yaml"


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.api_client = api_client
        self._objects = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._authz = kubernetes.client.AuthorizationV1Api(api_client)

    async def apply_device_status(self, namespace: str, name: str, status: dict[str, Any], reason: str) -> None:
        await self.apply_status("devices", namespace, name, "Device", status, reason)

    async def create_capability(self, body: dict[str, Any]) -> bool:
        """Create it; False if it already exists (identical content, since the name is the hash)."""
        try:
            await asyncio.to_thread(
                self._objects.create_cluster_custom_object, GROUP, VERSION, "capabilities", body,
                field_manager=FIELD_MANAGER,
            )
        except kubernetes.client.ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def create_device(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create it; None if a Device of that name exists already."""
        try:
            return await asyncio.to_thread(
                self._objects.create_namespaced_custom_object, GROUP, VERSION, namespace, "devices", body,
                field_manager=FIELD_MANAGER,
            )
        except kubernetes.client.ApiException as err:
            if err.status == 409:
                return None
            raise

    async def list_devices(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        if not namespaces:
            listed = await asyncio.to_thread(self._objects.list_cluster_custom_object, GROUP, VERSION, "devices")
            return list(listed["items"])
        items: list[dict[str, Any]] = []
        for namespace in namespaces:
            listed = await asyncio.to_thread(
                self._objects.list_namespaced_custom_object, GROUP, VERSION, namespace, "devices"
            )
            items += listed["items"]
        return items

    async def apply_status(self, plural: str, namespace: str, name: str, kind: str, status: dict[str, Any],
                           reason: str) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "status": status}
        await asyncio.to_thread(
            self._objects.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, plural, name, body,
            field_manager=FIELD_MANAGER, force=True, _content_type=_APPLY,
        )
        metrics.STATUS_WRITES.labels(reason=reason).inc()

    async def apply_intent_target(self, namespace: str, device: str, target: dict[str, Any], intent: str) -> dict[str, Any]:
        """Apply spec.target entries as `corral-intents`, without force: a field owned by someone else is a conflict."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Device",
            "metadata": {"name": device, "annotations": {"corral.dev/intent": intent}},
            "spec": {"target": target},
        }
        try:
            return await asyncio.to_thread(
                self._objects.patch_namespaced_custom_object,
                GROUP, VERSION, namespace, "devices", device, body,
                field_manager=INTENTS_FIELD_MANAGER, _content_type=_APPLY,
            )
        except kubernetes.client.ApiException as err:
            if err.status == 409:
                raise FieldConflict(api_message(err)) from None
            raise

    async def may(self, user: str, verb: str, namespace: str, device: str) -> bool:
        """SubjectAccessReview: may `user` do `verb` on devices/`device` (group corral.dev) in `namespace`?"""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": _implied_groups(user),
                "resourceAttributes": {
                    "group": GROUP, "resource": "devices", "verb": verb, "name": device, "namespace": namespace,
                },
            },
        }
        answer = await asyncio.to_thread(self._authz.create_subject_access_review, review)
        return bool(answer.status.allowed)

    async def delete_intent(self, namespace: str, name: str, uid: str) -> None:
        try:
            await asyncio.to_thread(
                self._objects.delete_namespaced_custom_object, GROUP, VERSION, namespace, "intents", name,
                body={"preconditions": {"uid": uid}},
            )
        except kubernetes.client.ApiException as err:
            if err.status not in (404, 409):
                raise

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        secret = await asyncio.to_thread(self._core.read_namespaced_secret, name, namespace)
        return dict(secret.data or {})


def _implied_groups(user: str) -> list[str]:
    """The groups Kubernetes gives a user by its name alone.

    An Intent records only the requester's username, so group memberships from
    an identity provider are not known here; grant Corral's verbs to users and
    ServiceAccounts, not to groups of people (see docs).
    """
    groups = ["system:authenticated"]
    if user.startswith("system:serviceaccount:"):
        namespace = user.split(":")[2] if user.count(":") >= 3 else ""
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    return groups
