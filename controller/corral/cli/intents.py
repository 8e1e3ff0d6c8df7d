"""`corral intents`, `corral approve NAME`, `corral deny NAME`: what people do with agents' requests."""

from __future__ import annotations

from typing import Any

import click
import kubernetes

from corral.api.codes import GROUP, VERSION
from corral.cli.kubeopts import kube_options
from corral.client.intents import decide_on


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also finished Intents, not only those waiting for approval.")
@kube_options
def intents(client: kubernetes.client.ApiClient, namespace: str, show_all: bool) -> None:
    """List Intents waiting for approval (with --all: every Intent)."""
    items = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "intents"
    )["items"]
    rows = []
    for item in sorted(items, key=lambda i: i["metadata"]["creationTimestamp"]):
        status, spec = item.get("status") or {}, item["spec"]
        if not show_all and status.get("phase") != "AwaitingApproval":
            continue
        rows.append((item["metadata"]["name"], spec["device"], f"{spec['actuator']}={spec['params']['value']!r}",
                     status.get("risk") or "-", status.get("phase") or "Pending", status.get("code") or "-",
                     spec["requester"], spec["reason"]))
    if not rows:
        click.echo("No Intents are waiting for approval." if not show_all else "No Intents.", err=True)
        return
    header = ("NAME", "DEVICE", "CHANGE", "RISK", "PHASE", "CODE", "REQUESTER", "REASON")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + str(row[-1]))


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
