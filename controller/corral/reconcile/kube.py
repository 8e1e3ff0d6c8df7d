"""The controller's writes to Kubernetes: server-side apply with a named field manager, off the event loop.

The official client is synchronous, so every call runs in a worker thread.
Status goes through the status subresource; each write is counted by reason,
because "no write when nothing changed" is a promise that tests measure.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import kubernetes

from corral.api.base import GROUP, VERSION

FIELD_MANAGER = "corral-controller"
_APPLY = "application/apply-patch+yaml"


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.api_client = api_client
        self._objects = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)
        self.status_writes: Counter[str] = Counter()

    async def apply_device_status(self, namespace: str, name: str, status: dict[str, Any], reason: str) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": name}, "status": status}
        await asyncio.to_thread(
            self._objects.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, "devices", name, body,
            field_manager=FIELD_MANAGER, force=True, _content_type=_APPLY,
        )
        self.status_writes[reason] += 1

    async def apply_capability_status(self, name: str, status: dict[str, Any]) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Capability", "metadata": {"name": name}, "status": status}
        await asyncio.to_thread(
            self._objects.patch_cluster_custom_object_status,
            GROUP, VERSION, "capabilities", name, body,
            field_manager=FIELD_MANAGER, force=True, _content_type=_APPLY,
        )
        self.status_writes["capability"] += 1

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

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        secret = await asyncio.to_thread(self._core.read_namespaced_secret, name, namespace)
        return dict(secret.data or {})
