"""The sentence inside a Kubernetes API error, for messages a person reads."""

from __future__ import annotations

import json

import kubernetes


def api_message(err: kubernetes.client.ApiException) -> str:
    """The API server's own `message` (what was wrong and often how to fix it), else the HTTP reason."""
    try:
        return str(json.loads(err.body).get("message") or err.reason)
    except (ValueError, TypeError, AttributeError):
        return str(err.reason)
