"""The Rule controller's parts, put together for reconcile/controller.py: its inputs (and the telemetry the MQTT
side keeps for them), its acting in a ServiceAccount's name, D2's revisions hook, and the Intent controller's
question (which Rule made this Intent) and the Rules' pause, both answered here."""

from __future__ import annotations

from collections.abc import Callable

from corral.audit.log import AuditLog
from corral.contract.model import Contract
from corral.decide.approvals import People
from corral.kube.access import AccessReviews
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.devices.trust import ContractTrust
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.intents.gather import Gatherer
from corral.reconcile.rules.acting import Acting
from corral.reconcile.rules.controller import Rules
from corral.reconcile.rules.inputs import RuleInputs
from corral.reconcile.rules.revisions import Revisions


class TrustedContracts:
    """A Device's trusted contract, with the cluster's risk floors: the one its device announced, when this replica
    heard it and it waits for nobody; else the Capability its status names as accepted (the owner writes that
    status, so the leader knows it for every shard, and after a restart before the device speaks again). None when
    neither is known: never a guess."""

    def __init__(self, devices: DeviceCache, trust: ContractTrust,
                 view_of: Callable[[str, str], DeviceView | None]) -> None:
        self.devices, self.trust, self.view_of = devices, trust, view_of

    def __call__(self, namespace: str, name: str) -> Contract | None:
        view = self.view_of(namespace, name)
        if view is not None and view.contract is not None and view.hold is None:
            return view.contract
        device = self.devices.device((namespace, name))
        status = device.status if device is not None else None
        if device is None or status is None:
            return None
        # As contract trust reads it (reconcile/devices/trust.py): Devices from before contracts were accepted
        # trusted what their status names, except a bridged one, whose status.capability nobody accepted.
        accepted = status.accepted_capability or (status.capability if device.spec.bridge is None else None)
        contract = self.trust.capabilities.contract(accepted, device.spec.device_id)
        return self.trust.effective(contract, device) if contract is not None else None


def rules_controller(kube: Kube, namespaces: tuple[str, ...], audit: AuditLog, recorder: EventRecorder,
                     people: People, access: AccessReviews, devices: DeviceCache,
                     view_of: Callable[[str, str], DeviceView | None], pauses: AgentPauses, trust: ContractTrust,
                     gatherer: Gatherer, leading: Callable[[], bool], owns: Callable[[str], bool]) -> Rules:
    rules = Rules(kube, namespaces, audit, recorder, people, RuleInputs(devices, view_of, owns),
                  Acting(kube, access, TrustedContracts(devices, trust, view_of)), Revisions(kube, audit, people),
                  paused=pauses.paused, rules_paused=pauses.rules_paused, leading=leading)
    pauses.on_rules_change = rules.on_pause_change
    gatherer.origin_of = rules.origin
    return rules
