"""`corral grants`: approvals given in advance, in bounds (ApprovalGrants), made, listed, renewed and revoked by
people. A grant voided by an edit of a Rule acting as its requester is listed as VOIDED; `renew` grants it again in
your name (the spec is immutable: a renewal is a new grant, checked like any other, and the voided one is revoked)."""

from __future__ import annotations

import json
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import kubernetes
from pydantic import ValidationError

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.grant import ApprovalGrant
from corral.cli.kubeopts import kube_options
from corral.client.intents import identity

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@click.group()
def grants() -> None:
    """Standing approvals: let one requester's Intents run without asking each time, in bounds."""


@grants.command("create")
@click.argument("requester")
@click.option("--device", "devices", multiple=True, metavar="NAME", help="A Device the grant covers (repeatable).")
@click.option("--selector", "selector", metavar="KEY=VALUE[,KEY=VALUE]", help="Devices by label, as well.")
@click.option("--actuator", "actuators", multiple=True, required=True, help="An actuator it covers (repeatable).")
@click.option("--value", "values", multiple=True, metavar="JSON",
              help="A value it covers (repeatable; a JSON value: true, 21, \"cool\"); or --range: one is required.")
@click.option("--range", "value_range", metavar="MIN..MAX", help="Numbers from MIN to MAX, both included.")
@click.option("--uses", type=click.IntRange(min=1, max=1000), required=True, help="How many Intents it lets run.")
@click.option("--expires-in", default="1h", show_default=True, metavar="DURATION",
              help="How long it lasts: 90s, 30m, 1h, 7d.")
@click.option("--reason", default="", help="Why, in a sentence.")
@click.option("--name", help="Name of the ApprovalGrant (default: grant-RANDOM).")
@kube_options
def create(client: kubernetes.client.ApiClient, namespace: str, requester: str, devices: tuple[str, ...],
           selector: str | None, actuators: tuple[str, ...], values: tuple[str, ...], value_range: str | None,
           uses: int, expires_in: str, reason: str, name: str | None) -> None:
    """Let REQUESTER's Intents on these Devices run without a per-request approval, USES times, until it expires.

    REQUESTER is a username, e.g. system:serviceaccount:home:agent. Critical-risk actions are never covered."""
    # A grant must say what it covers (the API server refuses any other): said here before anything is asked.
    if not devices and not selector:
        raise click.UsageError("a grant must say which Devices it covers: --device NAME (repeatable) or "
                               "--selector KEY=VALUE")
    if not values and not value_range:
        raise click.UsageError("a grant must say which values it covers: --value JSON (repeatable) or --range "
                               "MIN..MAX; a grant of any value is not in bounds")
    me = identity(client)
    spec: dict[str, Any] = {
        "grantor": me.username, "grantorGroups": list(me.groups), "requester": requester, "devices": list(devices),
        "actuators": list(actuators), "values": [_json(v) for v in values], "uses": uses,
        "expiresAt": (datetime.now(UTC) + _duration(expires_in)).strftime("%Y-%m-%dT%H:%M:%SZ"), "reason": reason}
    if selector:
        spec["selector"] = {"matchLabels": _labels(selector)}
    if value_range:
        spec["range"] = _range(value_range)
    body = {"apiVersion": API_VERSION, "kind": "ApprovalGrant",
            "metadata": {"name": name or f"grant-{secrets.token_hex(4)}"}, "spec": spec}
    try:
        ApprovalGrant.model_validate(body)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise click.UsageError(f"not a valid grant: {problems}") from None
    made = kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "approvalgrants", body)
    click.echo(f"{made['metadata']['name']}: {requester} may {'/'.join(actuators)} on "
               f"{', '.join(devices) or selector} {uses} time(s) until {spec['expiresAt']} without asking")


@grants.command("list")
@kube_options
def list_grants(client: kubernetes.client.ApiClient, namespace: str) -> None:
    """The grants of the namespace, with their uses."""
    items = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "approvalgrants")["items"]
    if not items:
        click.echo(f"No ApprovalGrants in {namespace}.")
    for item in items:
        spec, status = item["spec"], item.get("status") or {}
        voided = status.get("voided")
        said = (f" VOIDED by Rule {voided.get('rule')} revision {voided.get('generation')}: covers nothing until "
                f"renewed (corral grants renew {item['metadata']['name']})") if voided else ""
        click.echo(f"{item['metadata']['name']}: {spec['requester']} {'/'.join(spec['actuators'])}, used "
                   f"{status.get('used', 0)} of {spec['uses']}, granted by {spec['grantor']}, expires {spec['expiresAt']}"
                   f"{said}")


@grants.command("renew")
@click.argument("name")
@kube_options
def renew(client: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """Grant NAME again in your name, with the uses it has left and the same bounds and expiry, and revoke it.

    For a grant voided by an edit of a Rule: read the Rule first (corral rules show), since the grant lets its new
    revision run without asking."""
    objects = kubernetes.client.CustomObjectsApi(client)
    old = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "approvalgrants", name)
    me = identity(client)
    spec, status = dict(old["spec"]), old.get("status") or {}
    left = spec["uses"] - status.get("used", 0)
    if left < 1:
        raise click.ClickException(f"{name}: all {spec['uses']} uses are consumed; grant anew with corral grants create")
    spec.update({"grantor": me.username, "grantorGroups": list(me.groups), "uses": left})
    base = name[:50].rstrip("-")
    body = {"apiVersion": API_VERSION, "kind": "ApprovalGrant",
            "metadata": {"name": f"{base}-r{secrets.token_hex(3)}"}, "spec": spec}
    made = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "approvalgrants", body)
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, "approvalgrants", name)
    click.echo(f"{made['metadata']['name']}: {spec['requester']} may {'/'.join(spec['actuators'])} {left} more time(s) "
               f"until {spec['expiresAt']} without asking, granted by {me.username}; {name} revoked")


@grants.command("revoke")
@click.argument("name")
@kube_options
def revoke(client: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """Revoke the grant NAME: from now on nothing runs under it."""
    kubernetes.client.CustomObjectsApi(client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "approvalgrants", name)
    click.echo(f"{name}: revoked")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word is a string: cool


def _duration(text: str) -> timedelta:
    found = _DURATION.match(text.strip())
    if found is None:
        raise click.BadParameter(f"{text!r}: use a number and a unit, e.g. 90s, 30m, 1h, 7d", param_hint="--expires-in")
    return timedelta(seconds=float(found.group(1)) * _SECONDS[found.group(2)])


def _labels(text: str) -> dict[str, str]:
    labels = {}
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r}: use KEY=VALUE", param_hint="--selector")
        labels[key.strip()] = value.strip()
    return labels


def _range(text: str) -> dict[str, float]:
    low, sep, high = text.partition("..")
    try:
        if sep:
            return {"minimum": float(low), "maximum": float(high)}
    except ValueError:
        pass
    raise click.BadParameter(f"{text!r}: use MIN..MAX, e.g. 18..24", param_hint="--range")
