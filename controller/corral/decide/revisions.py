"""A Rule's revisions, pure: the spec as it is hashed and kept, the previous revision from its annotation, what a
replacement or a restore writes, whether a revision acts yet, which grants an edit voids, and a diff for people.

The spec is compared, hashed and kept in one form: the model's JSON (wire names, defaults filled in, nothing
absent written as null), so that the same Rule written by `kubectl`, the CLI or the gateway hashes the same, and a
restore followed by a restore gives back the very spec it started from.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from corral.api.rule import ACCEPTED_ANNOTATION, PREVIOUS_SPEC_ANNOTATION, RuleSpec
from corral.contract.canonical import sha256_hex
from corral.decide.approvals import SERVICE_ACCOUNT_PREFIX, People

REVISED = "rule.revised"  # the audit record of every new generation of a Rule
# The annotation is JSON of one spec: 16 actions and 32 inputs fit well within this; the API server's limit on all
# annotations together is 256 KiB.
MAX_PREVIOUS_SPEC = 64 * 1024


def spec_document(spec: RuleSpec) -> dict[str, Any]:
    """The spec as it is hashed and kept: wire names, defaults filled in."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def spec_hash(spec: RuleSpec) -> str:
    return sha256_hex(spec_document(spec))


def previous_spec(annotations: Mapping[str, str] | None) -> RuleSpec | None:
    """The revision before the last edit, when it is kept and still a valid spec."""
    text = (annotations or {}).get(PREVIOUS_SPEC_ANNOTATION)
    if not text:
        return None
    try:
        return RuleSpec.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return None


def previous_spec_hash(annotations: Mapping[str, str] | None) -> str | None:
    """The hash of the kept revision: of the spec when it parses, else of the annotation's text as it stands (an
    annotation anybody with `update` on rules may have written: it is evidence, not trusted)."""
    text = (annotations or {}).get(PREVIOUS_SPEC_ANNOTATION)
    if not text:
        return None
    kept = previous_spec(annotations)
    return spec_hash(kept) if kept is not None else sha256_hex(text)


def kept_annotation(spec: RuleSpec) -> str:
    """The annotation that keeps `spec` as the previous revision."""
    text = json.dumps(spec_document(spec), sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_PREVIOUS_SPEC:
        raise ValueError(f"the spec is {len(text)} characters of JSON; at most {MAX_PREVIOUS_SPEC} can be kept")
    return text


def replacing(current: RuleSpec | None, new: RuleSpec) -> dict[str, str | None]:
    """The annotations a replacement of the spec writes with it (a merge patch: None deletes): the spec it replaces
    is kept; a first revision keeps nothing."""
    if current is None or spec_document(current) == spec_document(new):
        return {}
    return {PREVIOUS_SPEC_ANNOTATION: kept_annotation(current)}


def restoring(current: RuleSpec, annotations: Mapping[str, str] | None, author: str,
              author_groups: Sequence[str] = ()) -> tuple[RuleSpec, str]:
    """The spec a restore writes (the kept revision, authored by whoever restores, with their groups: the kept
    author's would be refused by admission and reviewed for the wrong person) and the annotation that then keeps
    the replaced one, so that restoring twice toggles. ValueError when no revision is kept."""
    kept = previous_spec(annotations)
    if kept is None:
        raise ValueError("no previous revision is kept (it was never edited, or the kept one is not a valid spec)")
    restored = kept.model_copy(update={"author": author, "author_groups": list(author_groups) or None})
    return restored, kept_annotation(current)


@dataclass(frozen=True)
class Acceptance:
    """Whether the current revision may act: written by a person, or accepted by one for this very generation."""

    acts: bool
    by: str | None  # who wrote (a person) or accepted it
    why: str


def acceptance(spec: RuleSpec, generation: int, annotations: Mapping[str, str] | None, people: People) -> Acceptance:
    if people.includes(spec.author):
        return Acceptance(True, spec.author, f"written by {spec.author}, a person")
    value = (annotations or {}).get(ACCEPTED_ANNOTATION, "")
    accepted, _, by = value.partition(":")
    if accepted == str(generation) and by and people.includes(by):
        return Acceptance(True, by, f"written by {spec.author}, accepted by {by}")
    return Acceptance(False, None, f"written by {spec.author}, who is not a person: it acts once a person accepts "
                                   "this revision (corral rules accept)")


def accepted_value(generation: int, username: str) -> str:
    """The annotation value accepting this generation (the API server requires exactly this)."""
    return f"{generation}:{username}"


def service_account_username(namespace: str, service_account: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{service_account}"


def voids(generation: int, namespace: str, service_account: str, grant_requester: str, already_voided: bool,
          granted_at: datetime | None = None, seen_at: datetime | None = None) -> bool:
    """Whether a Rule's new generation voids a grant: any edit after the first voids the grants to the Rule's
    ServiceAccount, in the Rule's namespace, that are not voided already, except one a person made after the
    controller saw the edit (`seen_at`, see `edit_seen_at`; strictly later in whole seconds, as the API server
    stamps creationTimestamp: the same second voids it)."""
    if granted_at is not None and seen_at is not None and granted_at > edit_seen_at(seen_at):
        return False
    return (generation > 1 and not already_voided
            and grant_requester == service_account_username(namespace, service_account))


def edit_seen_at(now: datetime) -> datetime:
    """The time an edit counts as made: when the controller first saw its generation, in whole seconds. Never a time
    the object carries: its managedFields are written by whoever writes it, so the author of an edit could date it
    before a grant and keep the grant standing. Seeing the edit late (a controller restarted since) voids more, a
    grant a person made in between too: failing closed, they renew it."""
    return now.replace(microsecond=0)


def diff(before: RuleSpec | None, after: RuleSpec) -> list[str]:
    """A unified diff of two revisions, one line per field of the YAML-like JSON, for people to read."""
    def lines(spec: RuleSpec | None) -> list[str]:
        if spec is None:
            return []
        return json.dumps(spec_document(spec), indent=2, sort_keys=True, ensure_ascii=True).splitlines()
    return list(difflib.unified_diff(lines(before), lines(after), "previous", "current", lineterm="", n=2))
