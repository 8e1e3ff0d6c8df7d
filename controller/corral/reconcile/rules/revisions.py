"""Every new revision of a Rule: its audit record (`rule.revised`), and the grants it voids.

The Rule controller calls `observe` once for each generation it sees. The record names the author, the
generation, the hash of the spec and of the revision kept in the previous-spec annotation, and whether the
author is a person (a revision by anyone else acts only once a person accepts it). It also names the grants the
revision voids: any edit after the first voids the standing ApprovalGrants of the namespace whose requester is
the Rule's ServiceAccount, since the edit may change what they end up letting run without a person. The record
is on disk before any grant's status shows the voiding, and each voided grant cites it.

A grant made after the controller saw the edit (its creationTimestamp, stamped by the API server, against the
controller's clock when `observe` runs) is not voided. The edit's own time is never read from the Rule: its
managedFields are written by whoever writes the Rule, and a backdated edit kept the grants it should void (issue 41,
finding 10). A revision observed before (status.observedGeneration with its revisionAudit: a controller restarted
since) is not recorded or voided again, so a grant a person renewed stays renewed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from corral.api.codes import CONTROLLER_MANAGER, GROUP, VERSION
from corral.api.grant import ApprovalGrant, ApprovalGrantStatus, GrantVoided
from corral.api.intent import AuditCitation
from corral.api.rule import Rule
from corral.audit.log import AuditLog
from corral.decide.approvals import DEFAULT_PEOPLE, People
from corral.decide.revisions import (
    REVISED,
    previous_spec_hash,
    service_account_username,
    spec_hash,
    voids,
)
from corral.kube.client import MERGE, ApiError, path_of
from corral.kube.objects import Kube
from corral.kube.typed import Malformed, parse
from corral.obs import metrics

log = logging.getLogger(__name__)

VOID_ATTEMPTS = 5


class Revisions:
    def __init__(self, kube: Kube, audit: AuditLog, people: People = DEFAULT_PEOPLE,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.kube = kube
        self.audit = audit
        self.people = people
        self.clock = clock  # when an edit is seen: the controller's own clock, never a time the Rule carries

    async def observe(self, rule: Rule) -> AuditCitation | None:
        """Record this revision and void the grants it voids; the record's citation (for status.revisionAudit).
        None for an object without a generation (never one the API server gave). Raises Unwritable (OSError) when
        the audit log cannot be written (nothing is voided then), RuntimeError when a grant kept changing under the
        voiding: the caller tries again (a second record of the same revision is harmless; a voided grant stays so)."""
        meta = rule.metadata
        namespace, name, generation = meta.namespace or "", meta.name or "", meta.generation
        if generation is None:
            return None
        status = rule.status
        if status is not None and status.observed_generation == generation and status.revision_audit is not None:
            return status.revision_audit  # recorded before a restart: its grants were voided then
        spec = rule.spec
        seen = self.clock()  # the edit's time (decide.revisions.edit_seen_at)
        grants = await self._grants(namespace) if generation > 1 else []
        to_void = sorted(g.metadata.name or "" for g in grants if voids(
            generation, namespace, spec.service_account_name, g.spec.requester, _voided(g),
            g.metadata.creation_timestamp, seen))
        sealed = await self.audit.seal(REVISED, f"{namespace}/{name}", {
            "rule": name, "namespace": namespace, "generation": generation, "author": spec.author,
            "authorIsPerson": self.people.includes(spec.author), "specHash": spec_hash(spec),
            "previousSpecHash": previous_spec_hash(meta.annotations),
            "serviceAccount": service_account_username(namespace, spec.service_account_name),
            "dryRun": spec.dry_run, "voidedGrants": to_void}, uid=meta.uid)
        cited = AuditCitation(seq=sealed.seq, hash=sealed.hash)
        for grant in to_void:
            await self._void(namespace, grant, name, generation, spec.author, cited)
        return cited

    async def _grants(self, namespace: str) -> list[ApprovalGrant]:
        """The namespace's grants as the API server has them now (not a cache that may lag the edit)."""
        body = await self.kube.api.request("GET", path_of(GROUP, VERSION, "approvalgrants", namespace))
        found = []
        for item in body.get("items") or []:
            try:
                found.append(parse(ApprovalGrant, item))
            except Malformed as err:
                log.warning("%s; it covers nothing anyway", err)
        return found

    async def _void(self, namespace: str, grant: str, rule: str, generation: int, author: str,
                    cited: AuditCitation) -> None:
        """Write the voiding into the grant's status, with the resourceVersion read (a use being spent meanwhile
        makes it read again); a grant deleted meanwhile needs nothing."""
        path = path_of(GROUP, VERSION, "approvalgrants", namespace, grant)
        for _ in range(VOID_ATTEMPTS):
            try:
                body = await self.kube.api.request("GET", path)
                current = parse(ApprovalGrant, body)
            except ApiError as err:
                if err.status == 404:
                    return
                raise
            except Malformed:
                return
            status = current.status or ApprovalGrantStatus()
            if status.voided is not None:
                return
            message = (f"Voided: Rule {rule} acting as {current.spec.requester} was edited (revision {generation} by "
                       f"{author}); it covers nothing until a person grants it again (corral grants renew {grant}).")
            voided = GrantVoided(rule=rule, generation=generation, author=author[:512],
                                 at=datetime.now(UTC).replace(microsecond=0), message=message, audit=cited)
            patch: dict[str, Any] = {
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "status": {"voided": voided.model_dump(mode="json", by_alias=True, exclude_none=True),
                           "message": message}}
            try:
                await self.kube.api.request("PATCH", f"{path}/status", body=patch, content_type=MERGE,
                                            params={"fieldManager": CONTROLLER_MANAGER})
            except ApiError as err:
                if err.status == 409:
                    continue
                if err.status == 404:
                    return
                raise
            metrics.STATUS_WRITES.labels(reason="grant-voided").inc()
            return
        # Failing closed: the caller sees the revision as not observed and calls again.
        raise RuntimeError(f"ApprovalGrant {namespace}/{grant}: could not record its voiding after {VOID_ATTEMPTS} "
                           "conflicting writes")


def _voided(grant: ApprovalGrant) -> bool:
    return grant.status is not None and grant.status.voided is not None
