"""The `corral.dev/v1alpha1` API: typed models of its kinds, and the CRDs and policies made from them."""

from corral.api.approval import Approval
from corral.api.capability import Capability
from corral.api.checkpoint import AuditCheckpoint
from corral.api.device import Device
from corral.api.grant import ApprovalGrant
from corral.api.intent import Intent
from corral.api.interlock import Interlock
from corral.api.pause import AgentPause

KINDS = (Device, Capability, Intent, Approval, AuditCheckpoint, Interlock, ApprovalGrant, AgentPause)

__all__ = ["KINDS", "AgentPause", "Approval", "ApprovalGrant", "AuditCheckpoint", "Capability", "Device", "Intent", "Interlock"]
