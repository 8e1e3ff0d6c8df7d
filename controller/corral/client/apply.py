"""Server-side apply of YAML manifests, as `kubectl apply --server-side` does it, for `corral demo` and the tests."""

from __future__ import annotations

from typing import Any

import kubernetes
import yaml
from kubernetes.dynamic import DynamicClient


def apply_yaml(client: kubernetes.client.ApiClient, text: str, namespace: str | None = None, *,
               field_manager: str, force: bool = False) -> list[Any]:
    """Apply every document in text; `force` takes over fields another manager owns (--force-conflicts)."""
    dynamic = DynamicClient(client)
    applied = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = doc.get("metadata", {}).get("namespace") or (namespace if resource.namespaced else None)
        applied.append(resource.server_side_apply(
            body=doc, name=doc["metadata"]["name"], namespace=ns, field_manager=field_manager, force_conflicts=force))
    return applied
