"""The `corral.dev/v1alpha1` API: typed models of its kinds, and the CRDs and policies made from them.

The models load when first named (PEP 562): `corral.api.codes`, the vocabulary every command line imports,
must not pull in pydantic and eight models (a quarter of a second) on its way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.api.approval import Approval
    from corral.api.base import Resource
    from corral.api.capability import Capability
    from corral.api.checkpoint import AuditCheckpoint
    from corral.api.device import Device
    from corral.api.discovered import DiscoveredDevice
    from corral.api.grant import ApprovalGrant
    from corral.api.intent import Intent
    from corral.api.interlock import Interlock
    from corral.api.pause import AgentPause
    from corral.api.rule import Rule

    KINDS: tuple[type[Resource], ...]

_MODELS = {"Approval": "approval", "Capability": "capability", "AuditCheckpoint": "checkpoint", "Device": "device",
           "DiscoveredDevice": "discovered", "ApprovalGrant": "grant", "Intent": "intent", "Interlock": "interlock", "AgentPause": "pause",
           "Rule": "rule"}
_KIND_ORDER = ("Device", "Capability", "Intent", "Approval", "AuditCheckpoint", "Interlock", "ApprovalGrant",
               "AgentPause", "Rule", "DiscoveredDevice")


def __getattr__(name: str) -> Any:
    if name == "KINDS":
        return tuple(__getattr__(kind) for kind in _KIND_ORDER)
    if name in _MODELS:
        return getattr(importlib.import_module(f"corral.api.{_MODELS[name]}"), name)
    raise AttributeError(f"module 'corral.api' has no attribute {name!r}")


__all__ = ["KINDS", "AgentPause", "Approval", "ApprovalGrant", "AuditCheckpoint", "Capability", "Device",
           "DiscoveredDevice", "Intent", "Interlock", "Rule"]
