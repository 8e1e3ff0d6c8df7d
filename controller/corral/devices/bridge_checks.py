"""What a bridge's or a source's Secret may name: pure checks shared by `corral bridge add-source|add-account`
(client/bridge.py) and the controller (devices.bridge_accounts), which must check again because a Secret can be
written by hand.

A bridge credential names a broker username, and the controller makes that account: it must never be one Corral
keeps for another purpose (the controller's accounts, one per replica; the broker's admin; an enrolled device's) or
one another bridge claimed first. A source names a topic root its devices' topics must lie under, and the broker
lets it publish there: a root that is a level above or below Corral's own device topics (`iot` by default), the
discovery prefix the bridge reads, or another source's root would hand it what is not its own. Overlap is on topic
levels: `iot` overlaps `iot` and `iot/x`, not `iotx`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

# The local plane's and the chart's names (devcluster.files.BROKER_ADMIN and BROKER_CONTROLLER; a unit test keeps
# them equal): devices/ does not import the dev cluster.
ADMIN_USERNAME = "corral-admin"
CONTROLLER_USERNAME = "corral-controller"
DEFAULT_DISCOVERY_PREFIX = "homeassistant"
# Corral's default device prefix is reserved beside the configured one: a broker may also serve a controller at it.
DEFAULT_DEVICE_PREFIX = "iot"
MAX_TOPIC = 256
# A Home Assistant discovery node id, as Home Assistant (and bridge/discovery.py) reads one from a topic: one level.
NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
# No '.': the bridge's presence accounts are `<bridge>.<device id>` and sources' `source.<ns>.<name>`.
BRIDGE_USERNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
SOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class SourceLike(Protocol):
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def root(self) -> str: ...
    @property
    def discovery_prefix(self) -> str: ...


def overlap(a: str, b: str) -> bool:
    """Whether either topic is the other or lies under it, on level boundaries."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def node_label(node: str) -> str:
    """A node id or base topic as the bridge names its source in a DiscoveredDevice (a DNS label;
    bridge/catalog.py source_name): lower-cased, anything but ASCII letters and digits a '-'."""
    cleaned = "".join(ch if ch.isalnum() and ch.isascii() else "-" for ch in node.lower()).strip("-")[:63]
    return cleaned.strip("-") or "source"


def plain_topic_problem(what: str, value: str) -> str | None:
    """Why `value` is not a plain topic name that grants exactly what it says (None: it is)."""
    if not value or len(value) > MAX_TOPIC:
        return f"{what} {value[:60]!r} must be 1 to {MAX_TOPIC} characters"
    if any(ch in value for ch in "+#\0"):
        return f"{what} {value[:60]!r} contains an MQTT wildcard (+, #) or NUL; give a plain topic name"
    if value.startswith("$"):
        return f"{what} {value[:60]!r} starts with '$', the broker's own topics"
    if value.startswith("/") or value.endswith("/") or "//" in value:
        return f"{what} {value[:60]!r} has an empty level (a leading, trailing or double '/')"
    return None


def _discovery_prefixes(source: SourceLike) -> tuple[str, ...]:
    # Only a discovery node announces under a prefix; the bridge reads Home Assistant's by default.
    return (source.discovery_prefix,) if source.kind == "ha" else ()


def source_problem(source: SourceLike, device_prefix: str) -> str | None:
    """Why a source may not have an account, judged on its own (None: it may)."""
    if not SOURCE_NAME.fullmatch(source.name):
        return f"its name {source.name[:60]!r} is not a DNS label (lower-case letters, digits and '-', 1-63)"
    if source.kind == "ha" and not NODE_ID.fullmatch(source.node):
        return (f"its node id {source.node[:60]!r} is not one discovery topic level ([A-Za-z0-9_-], 1-128 "
                "characters): a '/' in it would let it announce under another node's id")
    if source.kind == "zigbee2mqtt" and source.root != source.node:
        return f"a zigbee2mqtt source's topic root is its base topic ({source.node!r}), not {source.root!r}"
    checks = [("its topic root", source.root), *(("its discovery prefix", p) for p in _discovery_prefixes(source))]
    for what, value in checks:
        problem = plain_topic_problem(what, value)
        if problem is not None:
            return problem
        for prefix in dict.fromkeys((device_prefix, DEFAULT_DEVICE_PREFIX)):
            if overlap(value, prefix):
                return (f"{what} {value!r} overlaps Corral's own device topics ({prefix!r}/...): the broker would "
                        "let it publish or hear every device's protocol")
    for prefix in dict.fromkeys((*_discovery_prefixes(source), DEFAULT_DISCOVERY_PREFIX)):
        if overlap(source.root, prefix):
            return (f"its topic root {source.root!r} overlaps the discovery prefix {prefix!r}: it could announce "
                    "devices under other sources' node ids")
    return None


def source_clash(source: SourceLike, older: SourceLike) -> str | None:
    """Why `source` may not have an account while `older` has one (None: both may)."""
    theirs = f"the older source {older.namespace}/{older.name}"
    if overlap(source.root, older.root):
        return f"its topic root {source.root!r} overlaps that of {theirs} ({older.root!r})"
    for prefix in _discovery_prefixes(older):
        if overlap(source.root, prefix):
            return f"its topic root {source.root!r} overlaps the discovery prefix of {theirs} ({prefix!r})"
    for prefix in _discovery_prefixes(source):
        if overlap(older.root, prefix):
            return f"its discovery prefix {prefix!r} overlaps the topic root of {theirs} ({older.root!r})"
    if source.kind == older.kind == "ha" and node_label(source.node) == node_label(older.node):
        return (f"its node id {source.node!r} names the same discovery node as {theirs}'s ({older.node!r}): the "
                "bridge could not tell whose devices it announces")
    return None


@dataclass(frozen=True)
class Reserved:
    """Broker usernames no bridge Secret may name: the controller's accounts (its own, every replica's by the same
    stem, and `corral-controller*`), the broker's admin, and the accounts enrolled devices have."""

    names: frozenset[str] = frozenset({ADMIN_USERNAME, CONTROLLER_USERNAME})
    prefixes: tuple[str, ...] = (CONTROLLER_USERNAME,)
    device_ids: frozenset[str] = frozenset()

    @classmethod
    def around(cls, controller_username: str, device_ids: frozenset[str] = frozenset()) -> Reserved:
        # Replicas are `<stem>-<ordinal>` (the chart's StatefulSet pods; the local plane's corral-controller-N).
        stem = re.sub(r"-[0-9]+$", "", controller_username)
        names = {ADMIN_USERNAME, CONTROLLER_USERNAME, *filter(None, (controller_username, stem))}
        return cls(frozenset(names), (CONTROLLER_USERNAME, *((stem + "-",) if stem else ())), device_ids)

    def why(self, username: str) -> str | None:
        if username in self.names or username.startswith(self.prefixes):
            return "it is the controller's broker account (or one of its replicas') or the broker admin's"
        if username in self.device_ids:
            return "a device enrolled with that id has it"
        return None


def bridge_username_problem(username: str, reserved: Reserved) -> str | None:
    """Why a bridge credential may not name this username (None: it may)."""
    if not BRIDGE_USERNAME.fullmatch(username):
        return (f"its username {username[:60]!r} is not letters, digits, '_' and '-' (1-63, no '.': the bridge's "
                "presence accounts and the sources' use it)")
    why = reserved.why(username)
    return None if why is None else f"its username {username!r} is not the bridge's to take: {why}"
