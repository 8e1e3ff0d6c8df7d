"""Broker accounts of bridged devices: each bridged source's and the bridge's own. Pure.

An MQTT subscriber cannot see who published a message, so the broker must make sure that only a device's source can
publish its state: what confirms a bridged command (corral bridge) is a new state message on the device's state
topic, and nobody else may be able to publish there. The controller keeps these accounts in Mosquitto's dynamic
security plugin exactly as it keeps device accounts (devices.accounts.plan_accounts), from three inputs:

- a **source** (a zigbee2mqtt instance, an ESPHome / Home Assistant discovery node): a Secret of type
  `corral.dev/bridge-source` (`corral bridge add-source`), with its kind, its node id or base topic, its topic root and
  a password. Its account publishes its discovery topics always, and the state and availability topics of its
  accepted devices only;
- **accepted bridged Devices** (`spec.bridge`, written by a person with `corral devices accept-discovered`): which
  topics a person accepted for which source. Nothing a source or the bridge says grants a topic: the grants follow the
  Devices, so deleting a Device (or its spec.bridge) takes them back at the next sync;
- the **bridge**: a Secret of type `corral.dev/bridge-credential` per namespace. Its account subscribes the sources'
  discovery topics and the accepted state and availability topics, publishes only the accepted command topics and
  the protocol topics of its devices (`{prefix}/{id}/info|status|ack|telemetry`), and subscribes their `cmd` and the
  controller's heartbeat. Every accepted device also gets a presence account `{bridge username}.{device id}` with the
  bridge's password, which may publish only `{prefix}/{id}/status`: the bridge holds one connection per device whose
  Last Will says `offline` (one Will per connection), and client ids are usernames on Corral's broker.

A source is granted only topics under its own topic root (its zigbee2mqtt base topic; for Home Assistant discovery,
the root given at add-source, by default its node id), and a root that overlaps an older source's gets no grants:
otherwise a person accepting a device in one namespace could hand its source another namespace's state topics. Nor
may a root overlap Corral's device topics or a discovery prefix, nor a bridge name a broker account Corral keeps for
another purpose (devices.bridge_checks); what is refused is said with the Secret it came from (`Refused.secret`), for
the Warning Event on it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.devices.accounts import BRIDGE_PURPOSE, Account, heartbeat_topic
from corral.devices.bridge_checks import Reserved, bridge_username_problem, source_clash, source_problem
from corral.devices.messages import Kind
from corral.devices.topics import Topics

SOURCE_TYPE = "corral.dev/bridge-source"
BRIDGE_TYPE = "corral.dev/bridge-credential"
BRIDGE_LABEL = "corral.dev/bridge"  # "source" or "account": what the controller's Secret watch selects
SERVES_LABEL = "corral.dev/bridge-namespace"  # on the chart's bridge Secret: the namespace the bridge serves
SOURCE_KINDS = ("ha", "zigbee2mqtt")
DEFAULT_DISCOVERY_PREFIX = "homeassistant"
DEFAULT_BRIDGE_USERNAME = "corral-bridge"
BRIDGE_PROTOCOL: tuple[Kind, ...] = ("info", "status", "ack", "telemetry")

Rule = dict[str, Any]
RESERVED = Reserved()  # the controller's and the admin's names, whatever the controller's own username is


@dataclass(frozen=True)
class Source:
    """A bridged source's account, from its Secret."""

    namespace: str
    name: str
    kind: str  # ha | zigbee2mqtt
    node: str  # ha: the discovery node id; zigbee2mqtt: its base topic
    root: str  # the topic root its device topics must be under
    password: str
    discovery_prefix: str = DEFAULT_DISCOVERY_PREFIX
    revoked: bool = False
    created: str = ""
    secret: str = ""  # the Secret's name (it is in `namespace`)

    @property
    def username(self) -> str:
        return source_username(self.namespace, self.name)

    def discovery(self) -> list[str]:
        """What it announces its devices on (topic filters)."""
        if self.kind == "zigbee2mqtt":
            return [f"{self.node}/bridge/#"]
        return [f"{self.discovery_prefix}/+/{self.node}/+/config", f"{self.discovery_prefix}/+/{self.node}/config"]

    def owns(self, topic: str) -> bool:
        return topic == self.root or topic.startswith(self.root + "/")


@dataclass(frozen=True)
class BridgeCredential:
    """The bridge's own account for one namespace (the bridged Devices it speaks for), from its Secret."""

    namespace: str
    username: str
    password: str
    revoked: bool = False
    secret_namespace: str = ""  # where its Secret is, when that is not `namespace` (the chart's, label below)
    created: str = ""  # the Secret's creationTimestamp: of two claiming one username, the older keeps it
    secret: str = ""  # the Secret's name

    @property
    def where(self) -> tuple[str, str]:
        """The Secret's namespace and name."""
        return (self.secret_namespace or self.namespace, self.secret)


@dataclass(frozen=True)
class Bridged:
    """An accepted bridged Device: what a person granted."""

    namespace: str
    device_id: str
    source: str
    command: tuple[str, ...] = ()
    state: tuple[str, ...] = ()
    availability: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    """Something a Secret or a Device asked for that gets no account or grant, and why."""

    why: str
    secret: tuple[str, str] | None = None  # the Secret's namespace and name, for the Warning Event on it

    def __str__(self) -> str:
        return self.why


@dataclass(frozen=True)
class BridgePlan:
    """The accounts wanted, and why some were refused (for the log and Events); `secrets`: each account's Secret."""

    accounts: dict[str, Account] = field(default_factory=dict)
    refused: tuple[Refused, ...] = ()
    secrets: dict[str, tuple[str, str]] = field(default_factory=dict)


def source_username(namespace: str, name: str) -> str:
    # A '.' never appears in a device id (a DNS label), so no source can take a device's username.
    return f"source.{namespace}.{name}"


def presence_username(bridge: str, device_id: str) -> str:
    return f"{bridge}.{device_id}"


def _text(data: Mapping[str, str], key: str, default: str = "") -> str:
    try:
        return base64.b64decode(data[key]).decode() if key in data else default
    except (ValueError, UnicodeDecodeError):
        return default


def secret_of(body: Mapping[str, Any]) -> Source | BridgeCredential | None:
    """What a Secret holds: a source, the bridge's credential, or None when it is neither (or malformed)."""
    meta = body.get("metadata") or {}
    data = body.get("data") or {}
    namespace, revoked = meta.get("namespace", ""), "corral.dev/revoked-at" in (meta.get("annotations") or {})
    created = str(meta.get("creationTimestamp") or "")
    password = _text(data, "password")
    if not password or not namespace:
        return None
    labels = meta.get("labels") or {}
    if body.get("type") == BRIDGE_TYPE or (body.get("type") == "Opaque" and labels.get(BRIDGE_LABEL) == "account"):
        # The chart's is an Opaque Secret (made at run time by `corral secrets ensure`, which makes no other type)
        # in the release namespace, naming the namespace it serves (BrokerAccounts trusts that only from there).
        served = labels.get(SERVES_LABEL) or namespace
        return BridgeCredential(served, _text(data, "username", DEFAULT_BRIDGE_USERNAME), password, revoked,
                                namespace if served != namespace else "", created, str(meta.get("name") or ""))
    if body.get("type") != SOURCE_TYPE:
        return None
    kind, node, name = _text(data, "kind"), _text(data, "node"), _text(data, "source")
    if kind not in SOURCE_KINDS or not node or not name or any(c in node for c in "+#"):
        return None
    root = _text(data, "root", node)
    if not root or any(c in root for c in "+#"):
        return None
    return Source(namespace, name, kind, node, root, password, _text(data, "discoveryPrefix", DEFAULT_DISCOVERY_PREFIX),
                  revoked, created, str(meta.get("name") or ""))


def _pub(topic: str) -> Rule:
    return {"acltype": "publishClientSend", "topic": topic, "allow": True}


def _sub(topic: str) -> Rule:
    return {"acltype": "subscribePattern", "topic": topic, "allow": True}


def _unique(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    seen: dict[tuple[str, str], Rule] = {}
    for rule in rules:
        seen.setdefault((rule["acltype"], rule["topic"]), rule)
    return tuple(seen[key] for key in sorted(seen))


def plan_bridge_accounts(topics: Topics, sources: Iterable[Source], bridges: Iterable[BridgeCredential],
                         bridged: Iterable[Bridged], reserved: Reserved = RESERVED) -> BridgePlan:
    """The accounts (with their own ACLs) that sources, bridges and accepted Devices ask for. `reserved`: broker
    usernames no bridge may take (the controller's, the admin's, the enrolled devices')."""
    refused: list[Refused] = []
    kept = _kept_sources(topics, sources, refused)
    grants = _grants(kept, bridged, refused)
    accounts: dict[str, Account] = {}
    secrets: dict[str, tuple[str, str]] = {}
    for (namespace, name), source in kept.items():
        accepted = grants.get((namespace, name), [])
        publishes = [*source.discovery(), *(t for d in accepted for t in (*d.state, *d.availability))]
        # It hears its own commands: zigbee2mqtt subscribes its whole base topic (it reads only `.../set`), a
        # discovery node its whole topic root and Home Assistant's birth message. Both subscribe once, when they
        # connect, before anything is accepted: a subscription granted only at acceptance would have been refused
        # then, and a device does not subscribe again by itself. Hearing is harmless: only the bridge may publish
        # commands there, and only accepted ones.
        listens = [f"{source.node}/#"] if source.kind == "zigbee2mqtt" else [
            f"{source.discovery_prefix}/status", f"{source.root}/#"]
        accounts[source.username] = Account(source.username, source.password, not source.revoked,
                                            _unique([*map(_pub, publishes), *map(_sub, listens)]), BRIDGE_PURPOSE)
        secrets[source.username] = (source.namespace, source.secret)
    for bridge in sorted(bridges, key=lambda b: (b.created, b.namespace, b.username)):
        problem = bridge_username_problem(bridge.username, reserved)
        if problem is None and bridge.username in accounts:
            problem = f"its username {bridge.username!r} is taken by an older bridge Secret"
        if problem is not None:
            refused.append(Refused(f"bridge account {bridge.username} for namespace {bridge.namespace}: {problem}; "
                                   "it gets no account", bridge.where))
            continue
        for username, account in _bridge_accounts(topics, bridge, kept, grants).items():
            accounts[username] = account
            secrets[username] = bridge.where
    return BridgePlan(accounts, tuple(refused), secrets)


def _kept_sources(topics: Topics, sources: Iterable[Source], refused: list[Refused]) -> dict[tuple[str, str], Source]:
    """The sources that get an account: sound on their own, and clashing with no older one."""
    kept: dict[tuple[str, str], Source] = {}
    for source in sorted(sources, key=lambda s: (s.created, s.namespace, s.name)):
        problem = source_problem(source, topics.prefix) or next(
            filter(None, (source_clash(source, older) for older in kept.values())), None)
        if problem is not None:
            refused.append(Refused(f"source {source.namespace}/{source.name}: {problem}; it gets no account",
                                   (source.namespace, source.secret)))
            continue
        kept[(source.namespace, source.name)] = source
    return kept


def _grants(kept: Mapping[tuple[str, str], Source], bridged: Iterable[Bridged],
            refused: list[Refused]) -> dict[tuple[str, str], list[Bridged]]:
    """The accepted Devices whose topics their source may be granted, by source."""
    grants: dict[tuple[str, str], list[Bridged]] = {}
    for device in sorted(bridged, key=lambda b: (b.namespace, b.device_id)):
        owner = kept.get((device.namespace, device.source))
        if owner is None:
            refused.append(Refused(f"bridged device {device.device_id} in {device.namespace}: no source "
                                   f"{device.source} is registered there (corral bridge add-source); its topics are "
                                   "granted to nobody"))
            continue
        outside = [t for t in (*device.command, *device.state, *device.availability) if not owner.owns(t)]
        if outside:
            refused.append(Refused(f"bridged device {device.device_id} in {device.namespace}: topics "
                                   f"{', '.join(outside)} are not under its source's topic root {owner.root!r}; its "
                                   "topics are granted to nobody"))
            continue
        grants.setdefault((device.namespace, device.source), []).append(device)
    return grants


def _bridge_accounts(topics: Topics, bridge: BridgeCredential, kept: Mapping[tuple[str, str], Source],
                     grants: Mapping[tuple[str, str], list[Bridged]]) -> dict[str, Account]:
    """The bridge's own account for one namespace, and one presence account per accepted device."""
    mine = [d for (namespace, _), devices in grants.items() if namespace == bridge.namespace for d in devices]
    theirs = [s for s in kept.values() if s.namespace == bridge.namespace]
    listens = [*(f"{s.discovery_prefix}/#" if s.kind == "ha" else f"{s.node}/bridge/#" for s in theirs),
               *(t for d in mine for t in (*d.state, *d.availability)),
               *(topics.of(d.device_id, "cmd") for d in mine), heartbeat_topic(topics)]
    publishes = [*(t for d in mine for t in d.command),
                 *(topics.of(d.device_id, kind) for d in mine for kind in BRIDGE_PROTOCOL)]
    accounts = {bridge.username: Account(bridge.username, bridge.password, not bridge.revoked,
                                         _unique([*map(_pub, publishes), *map(_sub, listens)]), BRIDGE_PURPOSE)}
    for device in mine:
        presence = presence_username(bridge.username, device.device_id)
        accounts[presence] = Account(presence, bridge.password, not bridge.revoked,
                                     (_pub(topics.of(device.device_id, "status")),), BRIDGE_PURPOSE)
    return accounts
