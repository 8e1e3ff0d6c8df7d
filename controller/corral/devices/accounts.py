"""Broker accounts for enrolled devices, as commands for Mosquitto's dynamic security plugin. Pure.

Each enrolled device gets one client (username = device id; the broker uses the username as client id,
so no identity can take over another's session) and one role of its own: the plugin has no per-username
ACL patterns, so least privilege needs a role per device. The role lets the device publish only on its
own `info`, `status`, `ack`, `telemetry` and `event` topics, and subscribe only to its own `cmd` topic
and the controller's heartbeat. Nothing else is allowed (the broker denies by default).

`plan_accounts()` compares what the broker has (`listClients`, `listRoles`) with what the enrollments ask
for, and returns only the commands that close the difference, so a controller that reconnects changes
nothing when nothing changed; the plugin rewrites its whole state file for every change.

It changes or deletes only clients Corral made: each carries a marker in its description (`marker()`: its prefix,
what it was made for, a digest of its password). A client without it (the controller's own accounts, the broker's
admin, another tool's) is never modified or deleted, whatever a Secret names: the wanted account of that name is
refused (`account_plan().refused`), so a Secret naming `corral-controller-0` cannot change the controller's password.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.devices.messages import Kind
from corral.devices.topics import Topics

CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
RESPONSE_TOPIC = f"{CONTROL_TOPIC}/response"
ROLE_PREFIX = "corral-device-"
DEVICE_PURPOSE = "device"
BRIDGE_PURPOSE = "bridge"  # a bridged source's, the bridge's or its presence account (devices.bridge_accounts)
DEVICE_PUBLISHES: tuple[Kind, ...] = ("info", "status", "ack", "telemetry", "event")

Command = dict[str, Any]


@dataclass(frozen=True)
class Account:
    """What one enrollment asks of the broker."""

    device_id: str  # the username: a device id, or a bridged source's or the bridge's (devices.bridge_accounts)
    password: str
    enabled: bool = True
    # The role's ACLs when they are not a device's own (acls()): a bridged source's or the bridge's.
    rules: tuple[dict[str, Any], ...] | None = None
    purpose: str = DEVICE_PURPOSE  # what the client is made for, written into its marker


@dataclass(frozen=True)
class AccountPlan:
    """The commands that close the difference, and the wanted accounts left undone: (username, why)."""

    commands: list[Command] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


def heartbeat_topic(topics: Topics) -> str:
    """The controller's heartbeat (the failsafe's): only the controller publishes there."""
    return f"{topics.prefix}/_corral/heartbeat"


def role_name(device_id: str) -> str:
    return ROLE_PREFIX + device_id


def acls(topics: Topics, device_id: str) -> list[dict[str, Any]]:
    own = [{"acltype": "publishClientSend", "topic": topics.of(device_id, kind), "allow": True}
           for kind in DEVICE_PUBLISHES]
    listens = [topics.of(device_id, "cmd"), heartbeat_topic(topics)]
    return own + [{"acltype": "subscribePattern", "topic": topic, "allow": True} for topic in listens]


def marker(topics: Topics, password: str, purpose: str = DEVICE_PURPOSE) -> str:
    """What the client's description carries: who manages it (this prefix), what for (a device's account has the
    marker it always had) and a digest of its password, so a reconnecting controller sees whether the broker's
    account matches the enrollment without the password."""
    digest = hashlib.sha256(password.encode()).hexdigest()[:16]
    return f"corral:{topics.prefix}:{digest}" if purpose == DEVICE_PURPOSE else f"corral:{topics.prefix}:{purpose}:{digest}"


def managed_by(description: str | None, topics: Topics) -> bool:
    """Whether this prefix's Corral made the client: only those are deleted when no enrollment wants them."""
    return bool(description) and str(description).startswith(f"corral:{topics.prefix}:")


_MARKER = re.compile(rf"corral:.+?:(?:({BRIDGE_PURPOSE}):)?[0-9a-f]{{16}}")


def purpose_of(description: str | None) -> str | None:
    """What Corral made the client for, from its marker (of any prefix: device ids are unique per broker, so a
    device moved to another prefix keeps its client); None when Corral did not make it (no marker)."""
    found = _MARKER.fullmatch(str(description or ""))
    if found is None:
        return None
    return BRIDGE_PURPOSE if found.group(1) else DEVICE_PURPOSE


def plan_accounts(topics: Topics, wanted: Mapping[str, Account], clients: list[dict[str, Any]],
                  roles: list[dict[str, Any]]) -> list[Command]:
    """The commands of `account_plan`."""
    return account_plan(topics, wanted, clients, roles).commands


def account_plan(topics: Topics, wanted: Mapping[str, Account], clients: list[dict[str, Any]],
                 roles: list[dict[str, Any]]) -> AccountPlan:
    """Commands that make the broker hold exactly the wanted accounts of this prefix.

    `clients` and `roles` are the plugin's verbose listings. A client without Corral's marker (the controller's,
    the broker's admin, another tool's) is never touched, and a wanted account of its username is refused. A client
    Corral made under another prefix is taken over when an enrollment here wants it (device ids are unique per
    broker) and otherwise left alone: only this prefix's unwanted clients are deleted. A client Corral made for the
    other purpose (a device's, now a bridge's name, or the reverse) is made anew: deleted, then created as wanted.
    """
    have_clients = {c["username"]: c for c in clients}
    have_roles = {r["rolename"]: r for r in roles}
    plan = AccountPlan()
    for device_id, account in sorted(wanted.items()):
        client = have_clients.get(device_id)
        made_for = purpose_of(client.get("textdescription")) if client is not None else account.purpose
        if made_for is None:
            plan.refused.append((device_id, "the broker has a client of that name that Corral did not make (the "
                                            "controller's, the admin's or another tool's); it is left alone"))
            continue
        if made_for != account.purpose:
            plan.commands.append({"command": "deleteClient", "username": device_id})
            client = None
        plan.commands.extend(_account_commands(topics, device_id, account, client, have_roles.get(role_name(device_id))))
    for username, client in sorted(have_clients.items()):
        if username not in wanted and managed_by(client.get("textdescription"), topics):
            plan.commands.append({"command": "deleteClient", "username": username})  # disconnects it now
            if role_name(username) in have_roles:
                plan.commands.append({"command": "deleteRole", "rolename": role_name(username)})
    return plan


def _account_commands(topics: Topics, device_id: str, account: Account, client: Mapping[str, Any] | None,
                      existing_role: Mapping[str, Any] | None) -> list[Command]:
    """What makes one wanted account (its role and its client) as the broker should hold it."""
    commands: list[Command] = []
    role = role_name(device_id)
    rules = list(account.rules) if account.rules is not None else acls(topics, device_id)
    if existing_role is None:
        commands.append({"command": "createRole", "rolename": role, "acls": rules})
    elif _rules(existing_role.get("acls") or []) != _rules(rules):
        commands.append({"command": "modifyRole", "rolename": role, "acls": rules})
    description = marker(topics, account.password, account.purpose)
    if client is None:
        commands.append({"command": "createClient", "username": device_id, "password": account.password,
                         "textdescription": description, "roles": [{"rolename": role}]})
        if not account.enabled:
            commands.append({"command": "disableClient", "username": device_id})
        return commands
    if client.get("textdescription") != description:
        commands.append({"command": "modifyClient", "username": device_id, "password": account.password,
                         "textdescription": description})
    if [r.get("rolename") for r in client.get("roles") or []] != [role]:
        commands.append({"command": "modifyClient", "username": device_id, "roles": [{"rolename": role}]})
    disabled = bool(client.get("disabled"))
    if account.enabled and disabled:
        commands.append({"command": "enableClient", "username": device_id})
    elif not account.enabled and not disabled:
        commands.append({"command": "disableClient", "username": device_id})  # disconnects it now
    return commands


# What the plugin does to a connected client when a command about it succeeds: disabling, deleting or modifying a
# client, or modifying its role, throws it off the broker ("kicks" it) without its Last Will, so its retained
# status still says `online` (Mosquitto 2.0, plugins/dynamic-security: mosquitto_kick_client_by_username(.., false)).
KICKING_CLIENT_COMMANDS = {"disableClient": "its broker account was disabled (revoked)",
                           "deleteClient": "its broker account was deleted",
                           "modifyClient": "its broker account was changed (a new password, after a rotation)"}


def disconnects(command: Command) -> tuple[str, str] | None:
    """(device id, why) of the device a successful command throws off the broker, or None when it throws off none
    of this prefix's devices. A device whose account still works reconnects, and says `online` again itself."""
    name = command.get("command")
    if name in KICKING_CLIENT_COMMANDS and command.get("username"):
        return str(command["username"]), KICKING_CLIENT_COMMANDS[str(name)]
    if name == "modifyRole" and str(command.get("rolename") or "").startswith(ROLE_PREFIX):
        return str(command["rolename"])[len(ROLE_PREFIX):], "its broker role was changed"
    return None


def mosquitto_acl_file(topics: Topics, controller: str) -> str:
    """The same rules for a Mosquitto that Corral does not manage (its `acl_file`): `%u` is the username,
    or with `use_identity_as_username` the client certificate's CN, which is the device id. The broker's
    default for an ACL file is to deny what no line allows."""
    lines = [f"# Corral device ACLs for topic prefix {topics.prefix!r}: each device its own topics only.",
             "# %u is the username, or the client certificate's CN (use_identity_as_username true).",
             *(f"pattern write {topics.of('%u', kind)}" for kind in DEVICE_PUBLISHES),
             f"pattern read {topics.of('%u', 'cmd')}",
             f"pattern read {heartbeat_topic(topics)}",
             "",
             "# The controller: commands and the heartbeat out, everything the devices say in.",
             f"user {controller}",
             f"topic readwrite {topics.prefix}/#"]
    return "\n".join(lines) + "\n"


def _rules(rules: list[dict[str, Any]]) -> set[tuple[str, str, bool]]:
    return {(r["acltype"], r["topic"], bool(r.get("allow"))) for r in rules}
