"""The `corral.dev/v1alpha1` API: typed models of the four kinds, and the CRDs and policies made from them."""

from corral.api.approval import Approval
from corral.api.capability import Capability
from corral.api.device import Device
from corral.api.intent import Intent

KINDS = (Device, Capability, Intent, Approval)

__all__ = ["KINDS", "Approval", "Capability", "Device", "Intent"]
