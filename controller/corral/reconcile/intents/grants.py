"""Standing approvals: the ApprovalGrants the controller knows, the ones that cover an Intent, and spending a use.

A use is consumed atomically: the grant is read from the API server and its status written back with the
resourceVersion it was read at, so two Intents racing for the last use cannot both get it (the loser reads
again and finds none left). A grant that was deleted (revoked) cannot be consumed: the read finds nothing.
The consuming Intent's UID goes into the status with the use, so an Intent decided again after a restart
does not spend a second one. Grants are read into their model where they enter (the cache, or the read
before a use is spent); one that does not parse covers nothing. A grant voided by a Rule's edit (status.voided,
reconcile/rules/revisions.py) covers nothing either, and the read before a use is spent checks that again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from corral.api.codes import CONTROLLER_MANAGER, GROUP, VERSION
from corral.api.grant import ApprovalGrant, ApprovalGrantStatus, GrantUse
from corral.decide.approvals import People
from corral.decide.grants import GrantView, covering
from corral.kube.access import AccessReviews
from corral.kube.cache import TypedCache
from corral.kube.client import MERGE, ApiError, path_of
from corral.kube.objects import Kube
from corral.kube.typed import Body, Malformed, parse
from corral.obs import metrics
from corral.reconcile.guards.interlocks import selector_of

log = logging.getLogger(__name__)

CONSUME_ATTEMPTS = 8


@dataclass(frozen=True)
class Spent:
    """A use consumed: which one of how many."""

    grant: str
    grantor: str
    use: int
    uses: int


class Grants:
    def __init__(self, kube: Kube, access: AccessReviews) -> None:
        self.kube = kube
        self.access = access
        self.cache: TypedCache[ApprovalGrant] = TypedCache(ApprovalGrant)

    def on_event(self, event_type: str, body: Body) -> bool:
        """Keep the cache; True when a grant appeared (waiting Intents it covers may run now)."""
        if event_type == "DELETED":
            self.cache.remove(body)
            return False
        return self._keep(body) and event_type == "ADDED"

    def _keep(self, body: Body) -> bool:
        try:
            return self.cache.upsert(body) is not None
        except Malformed as err:
            log.warning("%s; it covers nothing", err)
            return False

    async def covering(self, namespace: str, requester: str, device: str, labels: Mapping[str, str], actuator: str,
                       value: object, risk: str, now: datetime, people: People) -> list[GrantView]:
        """The grants in the namespace that cover this action, the grantor's `approve` right asked now."""
        candidates = [_view(grant, True) for (ns, _), grant in sorted(self.cache.items(), key=lambda item: item[0])
                      if ns == namespace]
        # The right is asked only of the grantors whose grants cover everything else: one review, not one per grant.
        found = covering(candidates, requester, device, labels, actuator, value, risk, now, people)
        checked = []
        for view in found:
            grant = self.cache.get((namespace, view.name))
            groups = grant.spec.grantor_groups if grant is not None else None
            may = await self.access.may(view.grantor, "approve", namespace, device, groups)
            checked.append(replace(view, grantor_may_approve=may))
        return covering(checked, requester, device, labels, actuator, value, risk, now, people)

    async def consume(self, namespace: str, name: str, intent: str, uid: str) -> Spent | None:
        """Spend one use of the grant for this Intent; None when none is left (used up, expired or revoked)."""
        path = path_of(GROUP, VERSION, "approvalgrants", namespace, name)
        for _ in range(CONSUME_ATTEMPTS):
            try:
                body = await self.kube.api.request("GET", path)
            except ApiError as err:
                if err.status == 404:
                    return None
                raise
            try:
                grant = parse(ApprovalGrant, body)
            except Malformed as err:
                log.warning("%s; it covers nothing", err)
                return None
            status = grant.status or ApprovalGrantStatus()
            if any(use.uid == uid for use in status.consumed_by):
                return Spent(name, grant.spec.grantor, status.used, grant.spec.uses)  # spent before a restart
            now = datetime.now(UTC)
            if status.used >= grant.spec.uses or now >= grant.spec.expires_at or status.voided is not None:
                return None
            used = status.used + 1
            new = status.model_copy(update={"used": used, "consumed_by": [*status.consumed_by, GrantUse(
                intent=intent, uid=uid, at=now.replace(microsecond=0))],
                "message": f"Use {used} of {grant.spec.uses}: Intent {intent}."})
            patch = {"metadata": {"resourceVersion": grant.metadata.resource_version},
                     "status": new.model_dump(mode="json", by_alias=True)}
            try:
                written = await self.kube.api.request("PATCH", f"{path}/status", body=patch, content_type=MERGE,
                                                      params={"fieldManager": CONTROLLER_MANAGER})
            except ApiError as err:
                if err.status == 409:
                    continue  # someone consumed one since we read it: read again
                if err.status == 404:
                    return None
                raise
            metrics.STATUS_WRITES.labels(reason="grant-used").inc()
            self._keep(written)
            return Spent(name, grant.spec.grantor, used, grant.spec.uses)
        log.warning("ApprovalGrant %s/%s: gave up consuming a use after %d conflicting writes", namespace, name,
                    CONSUME_ATTEMPTS)
        return None


def _view(grant: ApprovalGrant, grantor_may_approve: bool) -> GrantView:
    spec, status = grant.spec, grant.status or ApprovalGrantStatus()
    return GrantView(
        name=grant.metadata.name or "", grantor=spec.grantor, grantor_may_approve=grantor_may_approve,
        requester=spec.requester, actuators=frozenset(spec.actuators), uses=spec.uses, used=status.used,
        expires_at=spec.expires_at, devices=frozenset(spec.devices), selector=selector_of(spec.selector),
        values=tuple(spec.values), minimum=spec.range.minimum if spec.range else None,
        maximum=spec.range.maximum if spec.range else None, voided=_voided(status))


def _voided(status: ApprovalGrantStatus) -> str | None:
    voided = status.voided
    if voided is None:
        return None
    return (f"Rule {voided.rule} was edited (revision {voided.generation}{' by ' + voided.author if voided.author else ''}); "
            "a person renews it with corral grants renew")
