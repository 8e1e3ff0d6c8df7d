"""Kubernetes label selectors, matched against a Device's labels (interlocks and grants select Devices by them).

A selector that names a key of Corral's own label domain (corral.dev/: the location an agent may change, the shard,
...) cannot be trusted to say what it guards or covers: admission refuses one, and for one stored before that
rule the interlocks and grants fail closed (`derived_keys`; api/labels.py says why each is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from corral.api.labels import derived

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Selector:
    """A Kubernetes label selector: every label and every requirement must match; empty matches everything."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(_meets(r, labels) for r in self.requirements)

    def derived_keys(self) -> list[str]:
        """The keys it names that Corral writes, not people: a selector with any says nothing a guard may trust."""
        return derived([*self.match_labels, *(r.key for r in self.requirements)])


def _meets(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    if requirement.operator == "Exists":
        return present
    if requirement.operator == "DoesNotExist":
        return not present
    if requirement.operator == "In":
        return present and labels[requirement.key] in requirement.values
    return not present or labels[requirement.key] not in requirement.values  # NotIn
