"""`corral lease`: exclusive control of a Device, taken, given back and broken through Intents (acquire, release,
break), so that the controller alone writes the Lease objects; `list` reads them."""

from __future__ import annotations

import secrets
from typing import Any

import click
import kubernetes

from corral.api.intent import LEASE_ACTUATOR
from corral.api.lease import LABEL, LeaseObject
from corral.cli.kubeopts import kube_options
from corral.cli.outcomes import exit_status
from corral.client.intents import identity, outcome_code, submit, wait_settled
from corral.decide.leases import parse


@click.group()
def lease() -> None:
    """Exclusive control of a Device: while you hold its lease, nobody else's Intents act on it."""


def _ask(client: kubernetes.client.ApiClient, namespace: str, device: str, action: str, reason: str,
         holder: str | None, ttl_s: int | None = None) -> None:
    me = identity(client)
    spec: dict[str, Any] = {"device": device, "actuator": LEASE_ACTUATOR, "action": action, "reason": reason,
                            "requester": me.username, "requesterGroups": list(me.groups)}
    if ttl_s is not None:
        spec["params"] = {"value": ttl_s}
    if holder:
        spec["holderId"] = holder
    name = f"lease-{action}-{secrets.token_hex(6)}"
    submitted = submit(client, namespace, name, spec)
    if submitted.code == "DENY_ID_CONFLICT":
        raise click.ClickException(submitted.message)
    status = wait_settled(client, namespace, name, 15).get("status") or {}
    code = outcome_code(status)
    click.echo(f"{name}: {code}: {status.get('message', '')}")
    if code != "EXECUTED":
        raise SystemExit(exit_status(code))  # corral --help lists what each status means


@lease.command("acquire")
@click.argument("device")
@click.option("--reason", required=True, help="Why you need the Device to yourself (others are told).")
@click.option("--ttl", "ttl_s", type=click.IntRange(min=1), help="Idle seconds before it ends by itself (default 300).")
@click.option("--holder", help="Which of your clients holds it (default: none; the same id renews it).")
@kube_options
def acquire(client: kubernetes.client.ApiClient, namespace: str, device: str, reason: str, ttl_s: int | None,
            holder: str | None) -> None:
    """Take DEVICE's lease (or renew your own)."""
    _ask(client, namespace, device, "acquire", reason, holder, ttl_s)


@lease.command("release")
@click.argument("device")
@click.option("--holder", help="The holder id it was acquired with.")
@kube_options
def release(client: kubernetes.client.ApiClient, namespace: str, device: str, holder: str | None) -> None:
    """Give DEVICE's lease back."""
    _ask(client, namespace, device, "release", "released", holder)


@lease.command("break")
@click.argument("device")
@click.option("--reason", required=True, help="Why you take over (the former holder is told).")
@kube_options
def break_(client: kubernetes.client.ApiClient, namespace: str, device: str, reason: str) -> None:
    """End whoever's lease of DEVICE at once (needs approve on it)."""
    _ask(client, namespace, device, "break", reason, None)


@lease.command("list")
@kube_options
def list_leases(client: kubernetes.client.ApiClient, namespace: str) -> None:
    """The leased Devices of the namespace: holder, reason, until when."""
    items = kubernetes.client.CoordinationV1Api(client).list_namespaced_lease(namespace, label_selector=LABEL).items
    shown = 0
    for item in items:
        obj = LeaseObject.model_validate(client.sanitize_for_serialization(item))
        held, broken = parse(obj)
        device = obj.device
        if held is not None:
            click.echo(f"{device}: {held.who()} until {held.expires_at:%H:%M:%S} UTC unless renewed: {held.reason}")
            shown += 1
        elif broken is not None:
            click.echo(f"{device}: broken by {broken.by} at {broken.at:%H:%M:%S} UTC ({broken.reason}); was "
                       f"{broken.holder}'s")
            shown += 1
    if not shown:
        click.echo(f"No leased Devices in {namespace}.")
