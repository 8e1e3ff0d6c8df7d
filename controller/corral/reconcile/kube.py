"""The controller's calls to Kubernetes: server-side apply with named field managers, off the event loop.

The official client is synchronous, so every call runs on a thread pool of the controller's own (sized
for the reconcilers' concurrency, and kept apart from anything else that uses threads). Status goes
through the status subresource; each write is counted by reason, because "no write when nothing
changed" is a promise that tests measure. Writes return the object the API server answered with, so the
caller can put it into its cache at once instead of waiting for the watch to bring it.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import kubernetes

from corral.api.codes import CONTROLLER_MANAGER, GROUP, INTENTS_MANAGER, VERSION
from corral.client.errors import api_message
from corral.obs import metrics

T = TypeVar("T")
Body = dict[str, Any]

_APPLY = "application/apply-patch+yaml"


class FieldConflict(Exception):
    """Server-side apply refused: another field manager owns the field."""


class StaleVersion(Exception):
    """The object changed since the version a write was computed from (a resourceVersion precondition)."""


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient, threads: int = 16) -> None:
        self.api_client = api_client
        self._objects = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._authz = kubernetes.client.AuthorizationV1Api(api_client)
        self._events = kubernetes.client.EventsV1Api(api_client)
        # One HTTP connection per thread, kept: no call waits for a connection or pays a new TLS handshake.
        api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="corral-api")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- reads ----------------------------------------------------------------------------------------------

    async def list_objects(self, plural: str, namespaces: tuple[str, ...]) -> list[Body]:
        if not namespaces:
            listed = await self.call(self._objects.list_cluster_custom_object, GROUP, VERSION, plural)
            return list(listed["items"])
        items: list[Body] = []
        for namespace in namespaces:
            listed = await self.call(self._objects.list_namespaced_custom_object, GROUP, VERSION, namespace, plural)
            items += listed["items"]
        return items

    async def get_device(self, namespace: str, name: str) -> Body:
        return await self.call(self._objects.get_namespaced_custom_object, GROUP, VERSION, namespace, "devices", name)

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        secret = await self.call(self._core.read_namespaced_secret, name, namespace)
        return dict(secret.data or {})

    async def may(self, user: str, groups: list[str], verb: str, namespace: str, device: str) -> bool:
        """SubjectAccessReview: may `user` do `verb` on devices/`device` (group corral.dev) in `namespace`?"""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {
                    "group": GROUP, "resource": "devices", "verb": verb, "name": device, "namespace": namespace,
                },
            },
        }
        answer = await self.call(self._authz.create_subject_access_review, review)
        return bool(answer.status.allowed)

    # ---- writes ---------------------------------------------------------------------------------------------

    async def create_capability(self, body: Body) -> bool:
        """Create it; False if it already exists (identical content, since the name is the hash)."""
        try:
            await self.call(self._objects.create_cluster_custom_object, GROUP, VERSION, "capabilities", body,
                            field_manager=CONTROLLER_MANAGER)
        except kubernetes.client.ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def create_device(self, namespace: str, body: Body) -> Body | None:
        """Create it; None if a Device of that name exists already."""
        try:
            return await self.call(self._objects.create_namespaced_custom_object, GROUP, VERSION, namespace,
                                   "devices", body, field_manager=CONTROLLER_MANAGER)
        except kubernetes.client.ApiException as err:
            if err.status == 409:
                return None
            raise

    async def apply_status(self, plural: str, namespace: str, name: str, kind: str, status: dict[str, Any],
                           reason: str) -> Body:
        """Server-side apply of the whole status as `corral-controller`; the object as the server now has it."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "status": status}
        written = await self.call(
            self._objects.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, plural, name, body,
            field_manager=CONTROLLER_MANAGER, force=True, _content_type=_APPLY,
        )
        metrics.STATUS_WRITES.labels(reason=reason).inc()
        return written

    async def apply_intent_target(self, namespace: str, device: str, target: dict[str, Any], intent: str,
                                  resource_version: str) -> Body:
        """Apply spec.target as `corral-intents` on exactly `resource_version` of the Device.

        Without force: a field that another manager owns is a FieldConflict. The version is a
        precondition: if the Device changed since, StaleVersion, and the caller computes again.
        """
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Device",
            "metadata": {"name": device, "resourceVersion": resource_version,
                         "annotations": {"corral.dev/intent": intent}},
            "spec": {"target": target},
        }
        try:
            return await self.call(
                self._objects.patch_namespaced_custom_object,
                GROUP, VERSION, namespace, "devices", device, body,
                field_manager=INTENTS_MANAGER, _content_type=_APPLY,
            )
        except kubernetes.client.ApiException as err:
            if err.status == 409 and _is_field_conflict(err):
                raise FieldConflict(api_message(err)) from None
            if err.status == 409:
                raise StaleVersion(api_message(err)) from None
            raise

    async def delete_intent(self, namespace: str, name: str, uid: str) -> None:
        try:
            await self.call(self._objects.delete_namespaced_custom_object, GROUP, VERSION, namespace, "intents",
                            name, body={"preconditions": {"uid": uid}})
        except kubernetes.client.ApiException as err:
            if err.status not in (404, 409):
                raise

    async def create_event(self, namespace: str, body: Body) -> None:
        await self.call(self._events.create_namespaced_event, namespace, body)


def _is_field_conflict(err: kubernetes.client.ApiException) -> bool:
    """A server-side apply conflict names the managers whose fields it would take; a version conflict does not."""
    try:
        causes = (json.loads(err.body).get("details") or {}).get("causes") or []
    except (ValueError, TypeError, AttributeError):
        return False
    return any(cause.get("reason") == "FieldManagerConflict" for cause in causes)
