"""The Rule controller's parts, put together for reconcile/controller.py: its inputs (and the telemetry the MQTT
side keeps for them), its acting in a ServiceAccount's name, D2's revisions hook, and the Intent controller's
question (which Rule made this Intent) and the Rules' pause, both answered here."""

from __future__ import annotations

from collections.abc import Callable

from corral.audit.log import AuditLog
from corral.decide.approvals import People
from corral.kube.access import AccessReviews
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.intents.gather import Gatherer
from corral.reconcile.rules.acting import Acting
from corral.reconcile.rules.controller import Rules
from corral.reconcile.rules.inputs import RuleInputs
from corral.reconcile.rules.revisions import Revisions


def rules_controller(kube: Kube, namespaces: tuple[str, ...], audit: AuditLog, recorder: EventRecorder,
                     people: People, access: AccessReviews, devices: DeviceCache,
                     view_of: Callable[[str, str], DeviceView | None], pauses: AgentPauses, gatherer: Gatherer,
                     leading: Callable[[], bool], owns: Callable[[str], bool]) -> Rules:
    rules = Rules(kube, namespaces, audit, recorder, people, RuleInputs(devices, view_of, owns),
                  Acting(kube, access, view_of), Revisions(kube, audit, people),
                  paused=pauses.paused, rules_paused=pauses.rules_paused, leading=leading)
    pauses.on_rules_change = rules.on_pause_change
    gatherer.origin_of = rules.origin
    return rules
