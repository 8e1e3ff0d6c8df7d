"""Who a set of rendered NetworkPolicies admits, decided as the Kubernetes API defines it, so a chart test can ask
"may this source reach that pod's port?" of the very objects Helm would install.

The few parts the chart uses: podSelector and namespaceSelector (matchLabels, matchExpressions), ipBlock with
except, numeric ports. ipBlock is applied to every source address, a Pod's included, as k3s's kube-router
does (the API leaves Pod addresses to the implementation).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Source:
    """Where a connection comes from: an address, and for a Pod its namespace's and its own labels."""

    ip: str
    namespace: str | None = None  # None: not a Pod (a LAN client, a node)
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """A Pod that receives the connection, and the port."""

    namespace: str
    labels: Mapping[str, str]
    port: int


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector's verdict; an empty selector selects everything."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        verdict = {"In": key in labels and labels[key] in values,
                   "NotIn": key not in labels or labels[key] not in values,
                   "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not verdict:
            return False
    return True


def _in_block(ip: str, block: Mapping[str, Any]) -> bool:
    address = ipaddress.ip_address(ip)
    network = ipaddress.ip_network(block["cidr"])
    if address.version != network.version or address not in network:
        return False
    return not any(address in ipaddress.ip_network(cidr) for cidr in block.get("except") or []
                   if ipaddress.ip_network(cidr).version == address.version)


def _peer_admits(peer: Mapping[str, Any], source: Source, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        return _in_block(source.ip, peer["ipBlock"])
    if source.namespace is None:
        return False  # selectors name Pods only
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.namespace_labels):
            return False
    elif source.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector"), source.labels)


def _rule_admits(rule: Mapping[str, Any], source: Source, port: int, policy_namespace: str) -> bool:
    ports = rule.get("ports") or []
    if ports and not any(p.get("port") in (None, port) and p.get("protocol", "TCP") == "TCP" for p in ports):
        return False
    peers = rule.get("from") or []
    return not peers or any(_peer_admits(peer, source, policy_namespace) for peer in peers)


def admits(policies: Iterable[Mapping[str, Any]], source: Source, target: Target) -> bool:
    """True when a TCP connection from `source` to `target` is allowed: no policy isolates the target for
    ingress, or a rule of one that does admits it."""
    isolating = [p for p in policies if p["metadata"].get("namespace") == target.namespace
                 and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
                 and selects(p["spec"].get("podSelector"), target.labels)]
    if not isolating:
        return True
    return any(_rule_admits(rule, source, target.port, target.namespace)
               for policy in isolating for rule in policy["spec"].get("ingress") or [])
