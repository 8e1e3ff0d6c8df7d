"""`corral agents pause` / `resume` / `status`: the agents kill switch, written by people.

The switch of a namespace is its AgentPause `agents` (api/pause.py). Without -n, `pause` pauses every
namespace that has Devices (and every one that has a switch already), `resume` resumes every namespace that is
paused, and `status` shows them all: each needs the right to list Devices (AgentPauses) in all namespaces;
without it, name the namespace with -n. A namespace that gets its first Device after a pause is not paused by
it: pause it with -n (or pause again).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click
import kubernetes

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.pause import PAUSE_NAME, paused_of
from corral.cli.kubeopts import connect, kube_options
from corral.client.errors import api_message
from corral.client.intents import Identity, identity

WRITE_ATTEMPTS = 5


@click.group()
def agents() -> None:
    """The agents kill switch: stop every agent at once (people keep control), and let them act again."""


def _options(command: Callable[..., None]) -> Callable[..., None]:
    """The kube options as given (-n absent means every namespace), and the API server's refusals as sentences."""
    @functools.wraps(command)
    def refusals_said(**kwargs: Any) -> None:
        try:
            command(**kwargs)
        except kubernetes.client.ApiException as err:
            raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}"
                                       ) from None
    return kube_options(refusals_said, connected=False)


_wait = click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=10.0, show_default=True,
                     help="Seconds to wait for the controller to confirm it enforces the change (0: do not wait).")


@agents.command("pause")
@click.option("--reason", required=True, help="Why, in a sentence: agents are told it with every refusal.")
@_wait
@_options
def pause(kubeconfig: str | None, context: str | None, namespace: str | None, reason: str, wait_s: float) -> None:
    """Pause agents: from now on every Intent whose requester is not a person ends DENY_PAUSED, until resume.

    Without -n: every namespace that has Devices."""
    client, _ = connect(kubeconfig, context, namespace)
    objects = kubernetes.client.CustomObjectsApi(client)
    me = identity(client)
    namespaces = [namespace] if namespace else sorted(
        {item["metadata"]["namespace"] for item in _listed(objects, "devices")} | set(_switches(objects)))
    if not namespaces:
        raise click.ClickException("there are no Devices in any namespace you can see; name one with -n NAMESPACE")
    for ns in namespaces:
        current = _read(objects, ns)
        # Paused already: the pause goes on, for the new reason; it has been in force since it began.
        since = (current or {}).get("spec", {}).get("since") if paused_of(current) is not None else None
        written = _write(objects, ns, me, True, reason, since)
        click.echo(f"{ns}: agents paused by {me.username}: {reason}{_confirmed(objects, ns, written, wait_s)}")


@agents.command("resume")
@click.option("--reason", default="", help="Why agents may act again (recorded).")
@_wait
@_options
def resume(kubeconfig: str | None, context: str | None, namespace: str | None, reason: str, wait_s: float) -> None:
    """Let agents act again. Without -n: every namespace where they are paused."""
    client, _ = connect(kubeconfig, context, namespace)
    objects = kubernetes.client.CustomObjectsApi(client)
    me = identity(client)
    switches = {namespace: _read(objects, namespace)} if namespace else _switches(objects)
    paused = sorted(ns for ns, body in switches.items() if paused_of(body) is not None)
    if not paused:
        click.echo(f"Agents are not paused in {namespace}." if namespace else
                   "Agents are not paused in any namespace you can see.")
        return
    for ns in paused:
        written = _write(objects, ns, me, False, reason, None)
        click.echo(f"{ns}: agents resumed by {me.username}{': ' + reason if reason else ''}"
                   f"{_confirmed(objects, ns, written, wait_s)}")


@agents.command("status")
@_options
def status(kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
    """Whether agents are paused, where, since when, by whom and why. Without -n: every namespace."""
    client, _ = connect(kubeconfig, context, namespace)
    objects = kubernetes.client.CustomObjectsApi(client)
    switches = {namespace: _read(objects, namespace)} if namespace else _switches(objects)
    shown = {ns: body for ns, body in switches.items() if body is not None}
    if not shown:
        click.echo(f"Agents are not paused in {namespace}." if namespace else "Agents are not paused anywhere.")
        return
    for ns, body in sorted(shown.items()):
        spec, seen = body.get("spec") or {}, body.get("status") or {}
        found = paused_of(body)
        enforced = seen.get("observedGeneration") == body["metadata"].get("generation")
        if found is not None:
            line = f"{ns}: PAUSED since {spec.get('since')} by {found.by}{': ' + found.reason if found.reason else ''}"
        else:
            line = f"{ns}: agents act (resumed {spec.get('since')} by {spec.get('by')})"
        click.echo(line + ("" if enforced else " [not confirmed by the controller yet]"))


def _listed(objects: Any, plural: str) -> list[dict[str, Any]]:
    """Every object of this kind in all namespaces, for a person allowed to list them there."""
    try:
        items: list[dict[str, Any]] = objects.list_cluster_custom_object(GROUP, VERSION, plural)["items"]
    except kubernetes.client.ApiException as err:
        if err.status == 403:
            raise click.ClickException(
                f"you may not list {plural} in every namespace ({api_message(err)}); name the namespace with "
                "-n NAMESPACE") from None
        raise
    return items


def _switches(objects: Any) -> dict[str, dict[str, Any] | None]:
    """Every namespace's AgentPause, by namespace."""
    return {item["metadata"]["namespace"]: item for item in _listed(objects, "agentpauses")
            if item["metadata"]["name"] == PAUSE_NAME}


def _read(objects: Any, namespace: str) -> dict[str, Any] | None:
    try:
        body: dict[str, Any] = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentpauses",
                                                                     PAUSE_NAME)
        return body
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return None
        raise


def _write(objects: Any, namespace: str, me: Identity, paused: bool, reason: str, since: str | None
           ) -> dict[str, Any]:
    """Create or rewrite the namespace's switch in this person's name (the admission policy checks `by`)."""
    spec = {"paused": paused, "reason": reason, "by": me.username,
            "since": since or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "AgentPause", "metadata": {"name": PAUSE_NAME},
                            "spec": spec}
    for _ in range(WRITE_ATTEMPTS):
        current = _read(objects, namespace)
        try:
            if current is None:
                made: dict[str, Any] = objects.create_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                               "agentpauses", body)
                return made
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            replaced: dict[str, Any] = objects.replace_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                                "agentpauses", PAUSE_NAME, body)
            return replaced
        except kubernetes.client.ApiException as err:
            if err.status != 409:  # someone else wrote it meanwhile: read again
                raise click.ClickException(f"{namespace}: the API server refused: {err.status} {err.reason}: "
                                           f"{api_message(err)}") from None
    raise click.ClickException(f"{namespace}: the AgentPause kept changing under this write; try again")


def _confirmed(objects: Any, namespace: str, written: dict[str, Any], wait_s: float) -> str:
    """Wait until the controller says it enforces this very write; how the line ends."""
    generation = written["metadata"].get("generation")
    deadline = time.monotonic() + wait_s
    while wait_s > 0:
        seen = (_read(objects, namespace) or {}).get("status") or {}
        if seen.get("observedGeneration") == generation:
            return ". The controller enforces it." if seen.get("enforced") else ". The controller confirmed it."
        if time.monotonic() > deadline:
            click.echo(f"{namespace}: the controller has not confirmed it within {wait_s:g} s (is it running, and "
                       "does it watch this namespace?); it takes effect when it does.", err=True)
            break
        time.sleep(0.1)
    return "."


# -n here narrows "every namespace"; it does not default to the context's namespace as elsewhere.
for _command, _everywhere in ((pause, "every namespace with Devices"), (resume, "every namespace where they are paused"),
                              (status, "every namespace")):
    for _param in _command.params:
        if isinstance(_param, click.Option) and _param.name == "namespace":
            _param.help = f"Only this namespace (default: {_everywhere})."
