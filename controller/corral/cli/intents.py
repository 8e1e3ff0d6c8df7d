"""`corral intents [create]`, `corral approve NAME`, `corral deny NAME`: what people do with requests."""

from __future__ import annotations

import functools
import json
import secrets
from typing import Any

import click
import kubernetes

from corral.api.codes import GROUP, VERSION
from corral.cli.kubeopts import connect, kube_options
from corral.client.errors import api_message
from corral.client.intents import decide_on, identity, outcome_code, submit, wait_settled
from corral.contract.text import written_text


@click.group(invoke_without_command=True)
@click.option("--all", "show_all", is_flag=True, help="Also finished Intents, not only those waiting for approval.")
@functools.partial(kube_options, connected=False)
@click.pass_context
def intents(ctx: click.Context, kubeconfig: str | None, context: str | None, namespace: str | None,
            show_all: bool) -> None:
    """List Intents waiting for approval (with --all: every Intent); `create` makes one."""
    if ctx.invoked_subcommand is not None:
        return  # the subcommand connects with its own options
    client, namespace = connect(kubeconfig, context, namespace)
    try:
        items = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(
            GROUP, VERSION, namespace, "intents")["items"]
    except kubernetes.client.ApiException as err:
        raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None
    rows = []
    for item in sorted(items, key=lambda i: i["metadata"]["creationTimestamp"]):
        status, spec = item.get("status") or {}, item["spec"]
        if not show_all and status.get("phase") != "AwaitingApproval":
            continue
        change = f"{spec['actuator']}={(spec.get('params') or {}).get('value')!r}" if spec["action"] != "read" \
            else f"read {spec['actuator']}"
        rows.append((item["metadata"]["name"], spec["device"], change,
                     status.get("risk") or "-", status.get("phase") or "Pending", status.get("code") or "-",
                     spec["requester"], written_text(spec.get("reason"))))  # an agent's words, made safe to read
    if not rows:
        click.echo("No Intents are waiting for approval." if not show_all else "No Intents.", err=True)
        return
    header = ("NAME", "DEVICE", "CHANGE", "RISK", "PHASE", "CODE", "REQUESTER", "REASON")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + str(row[-1]))


@intents.command()
@click.argument("device")
@click.argument("change", metavar="ACTUATOR=VALUE")
@click.option("--action", help="The actuator's action (default: the one its contract names).")
@click.option("--reason", required=True, help="Why, in a sentence (audited).")
@click.option("--name", help="The Intent's name, its idempotency key (default: a new one).")
@click.option("--based-on", "based_on", multiple=True, metavar="METRIC@TS",
              help="A sample the request relies on, as `corral readings` shows it (repeatable).")
@click.option("--dry-run", is_flag=True, help="Run every check and print the outcome it would have; execute nothing.")
@click.option("--wait", "wait_s", type=float, default=15.0, show_default=True, help="Seconds to wait for the outcome.")
@kube_options
def create(client: kubernetes.client.ApiClient, namespace: str, device: str, change: str, action: str | None,
           reason: str, name: str | None, based_on: tuple[str, ...], dry_run: bool, wait_s: float) -> None:
    """Ask DEVICE for ACTUATOR=VALUE (a JSON value: true, 21.5, "auto"), in your own name, and print the outcome."""
    actuator, sep, text = change.partition("=")
    if not sep or not actuator:
        raise click.BadParameter(f"{change!r}: use ACTUATOR=VALUE, e.g. power=true", param_hint="ACTUATOR=VALUE")
    try:
        value = json.loads(text)
    except ValueError:
        value = text  # a bare word is a string: mode=auto
    if action is None:
        action = _action_of(client, namespace, device, actuator)
    spec: dict[str, Any] = {"device": device, "actuator": actuator, "action": action, "params": {"value": value},
                            "reason": reason}
    me = identity(client)
    spec.update(requester=me.username, requesterGroups=list(me.groups))
    if based_on:
        spec["basedOn"] = [_observation(item) for item in based_on]
    if dry_run:
        spec["dryRun"] = True
    name = name or f"cli-{'dry-' if dry_run else ''}{secrets.token_hex(6)}"
    submitted = submit(client, namespace, name, spec)
    if submitted.code == "DENY_ID_CONFLICT":
        raise click.ClickException(submitted.message)
    status = wait_settled(client, namespace, name, wait_s).get("status") or {}
    checked_only = " (dry run)" if status.get("phase") == "DryRun" else ""
    click.echo(f"{name}: {outcome_code(status)}{checked_only}: {status.get('message', '')}")


def _action_of(client: kubernetes.client.ApiClient, namespace: str, device: str, actuator: str) -> str:
    """The action the device's contract names for the actuator (its accepted Capability)."""
    objects = kubernetes.client.CustomObjectsApi(client)
    status = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "devices", device).get("status") or {}
    capability = status.get("acceptedCapability") or status.get("capability")
    if capability:
        contract = objects.get_cluster_custom_object(GROUP, VERSION, "capabilities", capability).get("spec") or {}
        for item in contract.get("actuators") or []:
            if item.get("id") == actuator:
                return str(item["action"])
    raise click.ClickException(f"Device {device} has no actuator {actuator!r} that its contract names; give --action "
                               "or check `corral tools --device DEVICE`.")


def _observation(item: str) -> dict[str, Any]:
    metric, sep, ts = item.partition("@")
    if not sep or not ts.isdigit():
        raise click.BadParameter(f"{item!r}: use METRIC@TS, e.g. temperature@1764583200123", param_hint="--based-on")
    return {"metric": metric, "ts": int(ts)}


@click.command()
@click.argument("name")
@click.option("--reason", default="", help="Why, in a sentence.")
@kube_options
def approve(client: kubernetes.client.ApiClient, namespace: str, name: str, reason: str) -> None:
    """Approve Intent NAME, in your own name, for exactly its current parameters."""
    _decide(client, namespace, name, "Approve", reason)


@click.command()
@click.argument("name")
@click.option("--reason", default="", help="Why, in a sentence (the requester sees it).")
@kube_options
def deny(client: kubernetes.client.ApiClient, namespace: str, name: str, reason: str) -> None:
    """Deny Intent NAME, in your own name."""
    _decide(client, namespace, name, "Deny", reason)


def _decide(client: kubernetes.client.ApiClient, namespace: str, name: str, decision: Any, reason: str) -> None:
    try:
        approval = decide_on(client, namespace, name, decision, reason)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    verb = "approved" if decision == "Approve" else "denied"
    click.echo(f"{name} {verb} by {approval['spec']['approver']} (Approval {approval['metadata']['name']})")
