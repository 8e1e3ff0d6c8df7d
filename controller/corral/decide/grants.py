"""Whether an ApprovalGrant covers an Intent: pure rules, one reason per miss.

A grant covers an Intent when it is for that requester, that Device (by name or by a selector that says
something), that actuator and that value (a listed one, or a number in its range: no list and no range covers
nothing), has a use left, has not expired, and its grantor is a
person who holds `approve` on the device now (asked again at every use, so a revoked right stops it).
A critical-risk action is never covered: it always waits for a person, one request at a time.
A grant voided by an edit of a Rule that acts as its requester covers nothing until a person grants anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypeGuard

from corral.api.labels import refusal
from corral.contract.values import same_value, shown
from corral.decide.approvals import DEFAULT_PEOPLE, People
from corral.decide.selectors import Selector


@dataclass(frozen=True)
class GrantView:
    """An ApprovalGrant in the Intent's namespace, with the grantor's `approve` permission already looked up."""

    name: str
    grantor: str
    grantor_may_approve: bool
    requester: str
    actuators: frozenset[str]
    uses: int
    used: int
    expires_at: datetime
    devices: frozenset[str] = frozenset()
    selector: Selector | None = None
    values: tuple[object, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    voided: str | None = None  # why an edit of a Rule voided it (status.voided), or None


def why_not_covered(grant: GrantView, requester: str, device: str, labels: Mapping[str, str], actuator: str,
                    value: object, risk: str, now: datetime, people: People = DEFAULT_PEOPLE, *,
                    then: object = None) -> str | None:
    """The reason the grant does not cover this action, or None when it does. A timed hold's `then` (what is put
    back after it, with no further decision) must be a granted value too: a hold is one request about two values."""
    if risk == "critical":
        return "critical-risk actions are never granted in advance"
    if grant.requester != requester:
        return f"it is for {grant.requester}"
    if grant.voided is not None:
        return f"it was voided: {grant.voided}"
    if grant.selector is not None and grant.selector.derived_keys():  # stored before admission refused such
        return f"it covers nothing: its selector key {refusal(grant.selector.derived_keys()[0])}; grant anew"
    if device not in grant.devices and not (_selects(grant.selector) and grant.selector.matches(labels)):
        return f"it does not cover Device {device}"
    if actuator not in grant.actuators:
        return f"it does not cover actuator {actuator}"
    if not _value_granted(grant, value):
        return f"it does not cover the value {shown(value)}"
    if then is not None and not _value_granted(grant, then):
        return f"it does not cover the value after the hold (then {shown(then)})"
    if now >= grant.expires_at:
        return f"it expired at {grant.expires_at:%Y-%m-%d %H:%M:%S} UTC"
    if grant.used >= grant.uses:
        return f"all {grant.uses} uses are consumed"
    if grant.grantor == requester or not people.includes(grant.grantor):
        return f"its grantor {grant.grantor} is not a person other than the requester"
    if not grant.grantor_may_approve:
        return f"its grantor {grant.grantor} no longer holds the 'approve' verb on this device"
    return None


def covering(grants: Iterable[GrantView], requester: str, device: str, labels: Mapping[str, str], actuator: str,
             value: object, risk: str, now: datetime, people: People = DEFAULT_PEOPLE, *,
             then: object = None) -> list[GrantView]:
    """The grants that cover this action (and a hold's `then`), the one expiring first first (it is the one to
    spend)."""
    found = [g for g in grants
             if why_not_covered(g, requester, device, labels, actuator, value, risk, now, people, then=then) is None]
    return sorted(found, key=lambda g: (g.expires_at, g.name))


def _value_granted(grant: GrantView, value: object) -> bool:
    if grant.minimum is not None and grant.maximum is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return grant.minimum <= float(value) <= grant.maximum
    # No list and no range is no bound: admission refuses such a grant, and one made before that rule covers nothing.
    return any(same_value(value, allowed) for allowed in grant.values)


def _selects(selector: Selector | None) -> TypeGuard[Selector]:
    """An empty selector would match every Device: a grant's selector covers something only with a label or a
    requirement in it."""
    return selector is not None and bool(selector.match_labels or selector.requirements)
