"""What one caller may do with Devices, from its own SelfSubjectRulesReview.

The gateway holds no rights: it asks the API server, with the caller's token,
which rules apply to the caller in each namespace, and evaluates them here.
One review per namespace answers every question for hundreds of devices, where
a SubjectAccessReview per device and verb would cost hundreds of calls.

Corral's permission levels are custom RBAC verbs on `devices` (DESIGN.md):
`read` (see the device, its state and contract), `listen` (its sensor readings
and live updates), `write` and `config` (actuators of that level). The API
verbs `get`/`list`/`watch`/`patch` still decide what the caller's token can
fetch or change; the gateway shows a device only when both agree.

Pure: no I/O, unit-tested.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.api.codes import GROUP

LEVELS = ("read", "listen", "write", "config")


@dataclass(frozen=True)
class Rule:
    verbs: frozenset[str]
    api_groups: frozenset[str]
    resources: frozenset[str]
    resource_names: frozenset[str]  # empty: every name

    def covers(self, group: str, resource: str, verb: str, name: str | None) -> bool:
        if not (self.verbs & {verb, "*"}) or not (self.api_groups & {group, "*"}):
            return False
        if not (self.resources & {resource, "*", f"{resource}/*"}) and "*/*" not in self.resources:
            return False
        return not self.resource_names or (name is not None and name in self.resource_names)


def rules_from_review(status: Mapping[str, Any]) -> tuple[Rule, ...]:
    """The resource rules of a SelfSubjectRulesReview status (as the API returns it, camelCase or snake_case)."""
    rules = status.get("resourceRules") or status.get("resource_rules") or []
    return tuple(
        Rule(
            verbs=frozenset(r.get("verbs") or ()),
            api_groups=frozenset(r.get("apiGroups") or r.get("api_groups") or ()),
            resources=frozenset(r.get("resources") or ()),
            resource_names=frozenset(r.get("resourceNames") or r.get("resource_names") or ()),
        )
        for r in rules
    )


@dataclass(frozen=True)
class NamespaceAccess:
    """The caller's rules in one namespace."""

    namespace: str
    rules: tuple[Rule, ...] = ()

    def may(self, verb: str, resource: str = "devices", name: str | None = None, group: str = GROUP) -> bool:
        return any(rule.covers(group, resource, verb, name) for rule in self.rules)

    def may_any(self, verb: str, resource: str = "devices", group: str = GROUP) -> bool:
        """True when the verb is granted for at least one object (a rule with or without names)."""
        return any(
            rule.verbs & {verb, "*"} and rule.api_groups & {group, "*"}
            and (rule.resources & {resource, "*"})
            for rule in self.rules
        )

    def listable(self) -> bool:
        """The caller can list and watch every Device in the namespace (a watch cache can serve it)."""
        return self.may("list") and self.may("watch")

    def named_devices(self) -> frozenset[str]:
        """Device names the caller may `get` by name, when it cannot list them all."""
        names: set[str] = set()
        for rule in self.rules:
            if rule.resource_names and rule.covers(GROUP, "devices", "get", next(iter(rule.resource_names))):
                names |= rule.resource_names
        return frozenset(names)

    def levels(self, device: str) -> frozenset[str]:
        """Corral levels the caller holds on one Device; empty unless it may also `get` the object."""
        if not self.may("get", name=device):
            return frozenset()
        return frozenset(level for level in LEVELS if self.may(level, name=device))

    def signature(self) -> tuple[Any, ...]:
        return tuple(sorted((tuple(sorted(r.verbs)), tuple(sorted(r.api_groups)), tuple(sorted(r.resources)),
                             tuple(sorted(r.resource_names))) for r in self.rules))


@dataclass(frozen=True)
class Access:
    """The caller's rules across the namespaces the gateway serves."""

    namespaces: Mapping[str, NamespaceAccess] = field(default_factory=dict)

    @classmethod
    def of(cls, reviews: Iterable[NamespaceAccess]) -> Access:
        return cls({r.namespace: r for r in reviews})

    def levels(self, namespace: str, device: str) -> frozenset[str]:
        ns = self.namespaces.get(namespace)
        return ns.levels(device) if ns else frozenset()

    def may(self, namespace: str, verb: str, resource: str = "devices", name: str | None = None) -> bool:
        ns = self.namespaces.get(namespace)
        return ns.may(verb, resource, name) if ns else False

    def signature(self) -> tuple[Any, ...]:
        return tuple(sorted((ns, a.signature()) for ns, a in self.namespaces.items()))
