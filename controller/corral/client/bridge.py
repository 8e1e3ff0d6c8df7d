"""A person's side of bridged devices: registering a source, the bridge's broker account, accepting a candidate.

- `add_source`: a Secret of type `corral.dev/bridge-source` with the source's broker identity (a zigbee2mqtt instance,
  a Home Assistant discovery node) and what it may announce on; the controller keeps its broker account
  (devices.bridge_accounts). Its state topics are granted only once a person accepts one of its devices.
- `add_account`: the bridge's own broker identity in a namespace (the chart makes its own at run time instead).
- `accept_discovered`: a DiscoveredDevice (what the bridge found) becomes a Device with `spec.bridge`: the contract
  hash a person accepted (with their risk overrides) and the device's own topics, which become broker grants. The
  acceptance is recorded on the DiscoveredDevice. The candidate's resourceVersion as shown is a precondition, so a
  person accepts exactly what they read.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes
from pydantic import ValidationError

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.discovered import DiscoveredDevice, contract_hash
from corral.bridge import claims
from corral.contract.model import Contract, Risk
from corral.contract.text import bounded
from corral.contract.trust import RISKS, with_risk
from corral.devices.bridge_accounts import (
    BRIDGE_LABEL,
    BRIDGE_TYPE,
    DEFAULT_BRIDGE_USERNAME,
    DEFAULT_DISCOVERY_PREFIX,
    RESERVED,
    SOURCE_TYPE,
    Source,
    secret_of,
    source_username,
)
from corral.devices.bridge_checks import bridge_username_problem, node_label, source_clash, source_problem

FIELD_MANAGER = "corral-accept-discovered"
DISCOVERED_LABEL = "corral.dev/discovered"  # on the Device: the candidate it was accepted from


class BridgeError(Exception):
    """A refused request, with a sentence a person can act on."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def source_secret_name(name: str) -> str:
    return f"corral-bridge-source-{name}"


def add_source(api_client: kubernetes.client.ApiClient, namespace: str, name: str, kind: str, node: str,
               root: str | None = None, discovery_prefix: str = DEFAULT_DISCOVERY_PREFIX,
               topic_prefix: str = "iot") -> tuple[str, str]:
    """Register a bridged source; (username, password) for its broker connection. `topic_prefix`: Corral's device
    topic prefix, which its topic root may not overlap (the controller refuses it too)."""
    password = secrets.token_urlsafe(24)
    username = source_username(namespace, name)
    source = Source(namespace, name, kind, node, root or node, password, discovery_prefix)
    problem = source_problem(source, topic_prefix)
    if problem is not None:
        raise BridgeError(f"source {name}: {problem}")
    data = {"source": name, "kind": kind, "node": node, "root": root or node, "discoveryPrefix": discovery_prefix,
            "username": username, "password": password}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": SOURCE_TYPE,
              "metadata": {"name": source_secret_name(name), "labels": {BRIDGE_LABEL: "source"}},
              "data": {key: _b64(value) for key, value in data.items()}}
    core = kubernetes.client.CoreV1Api(api_client)
    for existing in core.list_namespaced_secret(namespace, label_selector=f"{BRIDGE_LABEL}=source").items:
        other = secret_of(api_client.sanitize_for_serialization(existing))
        clash = source_clash(source, other) if isinstance(other, Source) and other.name != name else None
        if clash is not None:
            raise BridgeError(f"source {name}: {clash}")
    try:
        core.create_namespaced_secret(namespace, secret, field_manager=FIELD_MANAGER)
    except kubernetes.client.ApiException as err:
        if err.status == 409:
            raise BridgeError(f"source {name} is registered in {namespace} already (Secret "
                              f"{source_secret_name(name)}); delete it to register it anew") from None
        raise
    return username, password


def add_account(api_client: kubernetes.client.ApiClient, namespace: str,
                username: str = DEFAULT_BRIDGE_USERNAME) -> tuple[str, str]:
    """The bridge's broker identity for the bridged Devices of `namespace`; (username, password)."""
    problem = bridge_username_problem(username, RESERVED)
    if problem is not None:
        raise BridgeError(f"the bridge account: {problem}")
    password = secrets.token_urlsafe(24)
    secret = {"apiVersion": "v1", "kind": "Secret", "type": BRIDGE_TYPE,
              "metadata": {"name": f"corral-bridge-{username}", "labels": {BRIDGE_LABEL: "account"}},
              "data": {"username": _b64(username), "password": _b64(password)}}
    try:
        kubernetes.client.CoreV1Api(api_client).create_namespaced_secret(namespace, secret,
                                                                          field_manager=FIELD_MANAGER)
    except kubernetes.client.ApiException as err:
        if err.status == 409:
            raise BridgeError(f"the bridge account {username} exists in {namespace} already (Secret "
                              f"corral-bridge-{username})") from None
        raise
    return username, password


@dataclass(frozen=True)
class Candidate:
    """A DiscoveredDevice as shown to the person, and what accepting it would make."""

    discovered: DiscoveredDevice
    contract: Contract  # with the person's risk overrides
    source: Source  # the registered source it speaks through
    resource_version: str
    overrides: dict[str, Risk] = field(default_factory=dict)

    @property
    def accepted_hash(self) -> str:
        return contract_hash(self.contract)

    def summary(self) -> list[str]:
        spec = self.discovered.spec
        lines = [f"DiscoveredDevice {self.discovered.metadata.name}: {self.contract.name} (model {self.contract.model}) "
                 f"from {spec.source_kind} source {self.source.name} ({spec.source}), device id {spec.device_id}"]
        for actuator in self.contract.actuators:
            shape = (f"{actuator.range.min:g}..{actuator.range.max:g}{' ' + actuator.unit if actuator.unit else ''}"
                     if actuator.range is not None else ", ".join(actuator.values or []) or actuator.type)
            changed = " (your override)" if actuator.id in self.overrides else ""
            lines.append(f"  actuator {actuator.id}: {actuator.action} {shape}, risk {actuator.risk}{changed}, "
                         f"level {actuator.level}")
        lines += [f"  sensor {s.metric}{' (' + s.unit + ')' if s.unit else ''}" for s in self.contract.sensors]
        lines += [f"  left out: {part.what}: {part.reason}" for part in spec.left_out]
        topics = spec.topics
        lines.append(f"  broker grants: source publishes {', '.join(topics.state + topics.availability) or 'nothing'}; "
                     f"the bridge publishes {', '.join(topics.command) or 'nothing'}")
        lines.append("  No device-side clamp: the bridge validates and clamps every command.")
        return lines


def parse_risks(entries: tuple[str, ...] | list[str]) -> dict[str, Risk]:
    overrides: dict[str, Risk] = {}
    for entry in entries:
        actuator, sep, level = entry.partition("=")
        if not sep or not actuator or level not in RISKS:
            raise BridgeError(f"--risk {entry!r}: ACTUATOR=LEVEL with LEVEL one of {', '.join(RISKS)}")
        overrides[actuator] = level
    return overrides


def candidate(api_client: kubernetes.client.ApiClient, namespace: str, name: str,
              overrides: dict[str, Risk] | None = None) -> Candidate:
    """The candidate as it is now, ready to be shown; refuses what cannot be accepted."""
    objects = kubernetes.client.CustomObjectsApi(api_client)
    try:
        body = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "discovereddevices", name)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            raise BridgeError(f"no DiscoveredDevice {name} in {namespace}: `kubectl get discovereddevices -n "
                              f"{namespace}` lists the candidates the bridge found") from None
        raise
    try:
        discovered = DiscoveredDevice.model_validate(body)
    except ValidationError as err:
        raise BridgeError(f"DiscoveredDevice {name} cannot be read: {err.errors()[0]['msg']}") from None
    status = discovered.status
    if status is not None and status.accepted:
        raise BridgeError(f"DiscoveredDevice {name} was accepted already (Device {status.device}, by "
                          f"{status.accepted_by}); a changed contract is accepted on the Device: corral devices "
                          f"accept-contract {status.device}")
    contract = discovered.spec.contract.contract(discovered.spec.device_id)
    if contract_hash(contract) != discovered.spec.contract_hash:
        raise BridgeError(f"DiscoveredDevice {name}: its contractHash does not match its contract; the bridge will "
                          "write it again")
    unknown = sorted(set(overrides or {}) - {a.id for a in contract.actuators})
    if unknown:
        raise BridgeError(f"--risk names no actuator of {name}: {', '.join(unknown)} (it has "
                          f"{', '.join(a.id for a in contract.actuators) or 'none'})")
    source = _source(api_client, namespace, discovered)
    _not_claimed(api_client, namespace, discovered)
    return Candidate(discovered, with_risk(contract, overrides), source, str(body["metadata"]["resourceVersion"]),
                     dict(overrides or {}))


def _not_claimed(api_client: kubernetes.client.ApiClient, namespace: str, discovered: DiscoveredDevice) -> None:
    """Refuse a candidate whose topics another accepted Device has (bridge/claims.py): accepting a "light" on a
    lock's command topic would let a harmless command open the door."""
    items = kubernetes.client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "devices")["items"]
    held = []
    for item in items:
        topics = ((item.get("spec") or {}).get("bridge") or {}).get("topics") or {}
        if topics:
            held.append(claims.Claim(str(item["metadata"]["name"]), str(item["spec"].get("deviceId") or ""),
                                     frozenset(topics.get("command") or []),
                                     frozenset(t for kind in ("command", "state", "availability")
                                               for t in topics.get(kind) or [])))
    spec = discovered.spec
    reasons = claims.taken(spec.device_id, spec.topics.command, held) + claims.conflicts(
        (), [*spec.topics.state, *spec.topics.availability], (c for c in held if c.device_id != spec.device_id))
    if reasons:
        raise BridgeError(f"DiscoveredDevice {discovered.metadata.name} cannot be accepted: {'; '.join(reasons)}")


def _source(api_client: kubernetes.client.ApiClient, namespace: str, discovered: DiscoveredDevice) -> Source:
    """The registered source a candidate came from (its kind and discovery identity: node id or base topic)."""
    core = kubernetes.client.CoreV1Api(api_client)
    found = [held for held in (secret_of(api_client.sanitize_for_serialization(secret)) for secret in
                               core.list_namespaced_secret(namespace, label_selector=f"{BRIDGE_LABEL}=source").items)
             if isinstance(held, Source) and held.kind == discovered.spec.source_kind
             and discovered.spec.source in (held.node, as_label(held.node))]
    if len(found) > 1:
        raise BridgeError(f"sources {', '.join(sorted(s.name for s in found))} in {namespace} all answer to "
                          f"{discovered.spec.source!r}: the candidate could be any one's; remove all but one")
    if found:
        held = found[0]
        outside = [t for t in discovered.spec.topics.all() if not held.owns(t)]
        if outside:
            raise BridgeError(f"DiscoveredDevice {discovered.metadata.name} names topics outside its source's "
                              f"topic root {held.root!r}: {', '.join(outside)}; they cannot be granted")
        if held.revoked:
            raise BridgeError(f"source {held.name} is revoked")
        return held
    flag = "--node" if discovered.spec.source_kind == "ha" else "--base-topic"
    raise BridgeError(f"no source is registered in {namespace} for {discovered.spec.source_kind} "
                      f"{discovered.spec.source!r}: corral bridge add-source NAME --kind {discovered.spec.source_kind} "
                      f"{flag} {discovered.spec.source} -n {namespace}")


def as_label(identity: str) -> str:
    """A node id or base topic as the bridge names its source in a DiscoveredDevice (a DNS label; bridge/catalog.py
    source_name): lower-cased, anything but ASCII letters and digits a '-'."""
    return node_label(identity)


def who_am_i(api_client: kubernetes.client.ApiClient) -> str:
    try:
        review = kubernetes.client.AuthenticationV1Api(api_client).create_self_subject_review({})
        return str(review.status.user_info.username or "unknown")
    except kubernetes.client.ApiException:
        return "unknown"


def accept_discovered(api_client: kubernetes.client.ApiClient, namespace: str, shown: Candidate,
                      device_name: str | None = None) -> str:
    """Accept the candidate exactly as shown: make its Device, then record the acceptance. The Device's name."""
    objects = kubernetes.client.CustomObjectsApi(api_client)
    name = str(shown.discovered.metadata.name)
    device_name = device_name or name
    spec = shown.discovered.spec
    by = who_am_i(api_client)
    # The precondition: nothing changed since it was shown (a no-op write fails with 409 on another resourceVersion).
    try:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "discovereddevices", name,
            {"metadata": {"resourceVersion": shown.resource_version}}, field_manager=FIELD_MANAGER)
    except kubernetes.client.ApiException as err:
        if err.status == 409:
            raise BridgeError(f"DiscoveredDevice {name} changed since it was shown (the bridge read its discovery "
                              "again): run the command again to see and accept what it is now") from None
        raise
    bridge: dict[str, Any] = {"source": shown.source.name, "discovered": name, "acceptedContractHash": shown.accepted_hash,
                              "acceptedBy": by, "topics": spec.topics.model_dump(mode="json", by_alias=True)}
    if shown.overrides:
        bridge["risk"] = shown.overrides
    if spec.left_out:
        bridge["leftOut"] = [bounded(f"{part.what}: {part.reason}", 512) for part in spec.left_out[:32]]
    device = {"apiVersion": API_VERSION, "kind": "Device",
              "metadata": {"name": device_name, "labels": {DISCOVERED_LABEL: name,
                                                          "corral.dev/device-type": spec.source_kind}},
              "spec": {"deviceId": spec.device_id, "bridge": bridge}}
    try:
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "devices", device,
                                                field_manager=FIELD_MANAGER)
    except kubernetes.client.ApiException as err:
        if err.status == 409:
            raise BridgeError(f"a Device {device_name} exists in {namespace} already: accept under another name "
                              "(--as NAME)") from None
        raise
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"apiVersion": API_VERSION, "kind": "DiscoveredDevice", "metadata": {"name": name},
              "status": {"accepted": True, "acceptedBy": by, "acceptedAt": at, "device": device_name,
                         "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                                         "message": f"accepted by {by} as Device {device_name}",
                                         "lastTransitionTime": at}]}}
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "discovereddevices", name, status,
                                                  field_manager=FIELD_MANAGER, force=True,
                                                  _content_type="application/apply-patch+yaml")
    return device_name
