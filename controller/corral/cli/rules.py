"""`corral rules`: Rules as people govern them: list, show (with the diff against the kept revision), accept an
agent's revision, restore the previous one, and pause or resume every Rule of a namespace.

Accepting writes the annotation corral.dev/accepted = "<generation>:<your username>" for the revision you were shown;
the API server admits it only while that is the Rule's current generation, and only with your `approve` verb on the
Rule, so an edit in between is refused. (No resourceVersion precondition: the controller's status writes change it
every few seconds, and they do not change what you accept.) The Rules' switch is the AgentPause named `rules` (api/pause.py RULES_PAUSE_NAME): the agents' switch
does not stop a person's Rules, this one stops all of them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click
import kubernetes
from pydantic import ValidationError

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.pause import RULES_PAUSE_NAME, paused_of
from corral.api.rule import ACCEPTED_ANNOTATION, PREVIOUS_SPEC_ANNOTATION, Rule
from corral.cli.kubeopts import kube_options
from corral.client.errors import api_message
from corral.client.intents import identity
from corral.contract.text import written_text
from corral.decide.approvals import DEFAULT_PEOPLE
from corral.decide.revisions import acceptance, accepted_value, diff, previous_spec, restoring, spec_document

WRITE_ATTEMPTS = 5


@click.group()
def rules() -> None:
    """Rules that act without an agent: read them, accept an agent's revision, restore the previous one, pause."""


def _objects(client: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.CustomObjectsApi(client)


def _rule(client: kubernetes.client.ApiClient, namespace: str, name: str) -> tuple[dict[str, Any], Rule]:
    try:
        body: dict[str, Any] = _objects(client).get_namespaced_custom_object(GROUP, VERSION, namespace, "rules", name)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            raise click.ClickException(f"no Rule {name} in {namespace}") from None
        raise
    try:
        return body, Rule.model_validate(body)
    except ValidationError as err:
        raise click.ClickException(f"Rule {namespace}/{name} is not valid as stored: {err.errors()[0]['msg']}") from None


def _acts(rule: Rule) -> str:
    meta = rule.metadata
    return acceptance(rule.spec, meta.generation or 0, meta.annotations, DEFAULT_PEOPLE).why


@rules.command("list")
@kube_options
def list_rules(client: kubernetes.client.ApiClient, namespace: str) -> None:
    """The Rules of the namespace: state, last fired, whose revision, and whether it acts."""
    items = _objects(client).list_namespaced_custom_object(GROUP, VERSION, namespace, "rules")["items"]
    if not items:
        click.echo(f"No Rules in {namespace}.")
    for item in items:
        try:
            rule = Rule.model_validate(item)
        except ValidationError:
            click.echo(f"{item['metadata']['name']}: not a valid Rule")
            continue
        status = rule.status
        fired = status.last_fired.isoformat() if status and status.last_fired else "never"
        click.echo(f"{rule.metadata.name}: {(status.state if status else None) or 'unseen'}, last fired {fired}, "
                   f"as {rule.spec.service_account_name}, revision {rule.metadata.generation} {_acts(rule)}"
                   f"{', dry run' if rule.spec.dry_run else ''}")


@rules.command("show")
@click.argument("name")
@kube_options
def show(client: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """NAME's spec, status, whether this revision acts, and its diff against the kept previous revision."""
    _, rule = _rule(client, namespace, name)
    meta, status = rule.metadata, rule.status
    click.echo(f"Rule {namespace}/{name}, revision {meta.generation}: {_acts(rule)}")
    if status is not None:
        click.echo(f"State: {status.state or 'unseen'}{' (' + status.code + ')' if status.code else ''}: "
                   f"{written_text(status.message, 1024)}")
        click.echo(f"Last fired: {status.last_fired.isoformat() if status.last_fired else 'never'}; "
                   f"fired {status.firings} time(s)")
    click.echo("Spec:")
    click.echo(json.dumps(spec_document(rule.spec), indent=2, sort_keys=True, ensure_ascii=True))
    kept = previous_spec(meta.annotations)
    if kept is None:
        click.echo("No previous revision is kept.")
        return
    # The kept revision is what the last editor wrote into the annotation: the audit log's rule.revised records
    # hold the hash of every revision as it was written, to check it against.
    click.echo("Changes against the kept previous revision (corral rules restore puts it back):")
    for line in diff(kept, rule.spec) or ["  (none)"]:
        click.echo(line)


@rules.command("accept")
@click.argument("name")
@click.option("--generation", type=click.IntRange(min=1),
              help="Accept only this revision (as `corral rules show` printed it); default: the current one, shown.")
@kube_options
def accept(client: kubernetes.client.ApiClient, namespace: str, name: str, generation: int | None) -> None:
    """Accept NAME's current revision in your name: an agent's revision acts only once a person accepts it."""
    me = identity(client)
    rule = _rule(client, namespace, name)[1]
    current = rule.metadata.generation or 0
    if generation is not None and generation != current:
        raise click.ClickException(f"Rule {name} is at revision {current}, not {generation}: it changed since you "
                                   "looked; read it again (corral rules show)")
    value = accepted_value(current, me.username)
    patch = {"metadata": {"annotations": {ACCEPTED_ANNOTATION: value}}}
    try:
        _objects(client).patch_namespaced_custom_object(GROUP, VERSION, namespace, "rules", name, patch)
    except kubernetes.client.ApiException as err:
        now = _rule(client, namespace, name)[1].metadata.generation
        if now != current:
            raise click.ClickException(f"Rule {name} changed while you accepted it (revision {current} is now {now}); "
                                       "read it again (corral rules show) and accept what you see") from None
        raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None
    click.echo(f"{name}: revision {current} by {rule.spec.author} accepted by {me.username}; it acts as "
               f"{rule.spec.service_account_name}: {written_text(rule.spec.reason)}")


@rules.command("restore")
@click.argument("name")
@kube_options
def restore(client: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """Put NAME's previous revision back, as your revision (the replaced one is kept: restore again toggles)."""
    me = identity(client)
    body, rule = _rule(client, namespace, name)
    try:
        spec, kept = restoring(rule.spec, rule.metadata.annotations, me.username)
    except ValueError as err:
        raise click.ClickException(f"Rule {name}: {err}") from None
    replaced = {key: value for key, value in body.items() if key != "status"}
    replaced["metadata"] = {**body["metadata"], "annotations": {**(body["metadata"].get("annotations") or {}),
                                                                PREVIOUS_SPEC_ANNOTATION: kept}}
    replaced["spec"] = spec_document(spec)
    try:
        written = _objects(client).replace_namespaced_custom_object(GROUP, VERSION, namespace, "rules", name, replaced)
    except kubernetes.client.ApiException as err:
        if err.status == 409:
            raise click.ClickException(f"Rule {name} changed while you restored it; read it again") from None
        raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None
    click.echo(f"{name}: previous revision restored as revision {written['metadata'].get('generation')} by "
               f"{me.username}")


@rules.command("pause")
@click.option("--reason", required=True, help="Why, in a sentence (recorded, shown with every Rule's status).")
@kube_options
def pause(client: kubernetes.client.ApiClient, namespace: str, reason: str) -> None:
    """Pause every Rule of the namespace (people's and agents'): none fires until resume."""
    _switch(client, namespace, True, reason)
    click.echo(f"{namespace}: Rules paused by {identity(client).username}: {reason}")


@rules.command("resume")
@click.option("--reason", default="", help="Why Rules may act again (recorded).")
@kube_options
def resume(client: kubernetes.client.ApiClient, namespace: str, reason: str) -> None:
    """Let the namespace's Rules act again."""
    _switch(client, namespace, False, reason)
    click.echo(f"{namespace}: Rules resumed by {identity(client).username}{': ' + reason if reason else ''}")


def _switch(client: kubernetes.client.ApiClient, namespace: str, paused: bool, reason: str) -> dict[str, Any]:
    """Create or rewrite the AgentPause `rules` in this person's name (the admission policy checks `by`)."""
    objects, me = _objects(client), identity(client)
    for _ in range(WRITE_ATTEMPTS):
        try:
            current: dict[str, Any] | None = objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "agentpauses", RULES_PAUSE_NAME)
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
            current = None
        since = (current or {}).get("spec", {}).get("since") if paused and paused_of(current) is not None else None
        body: dict[str, Any] = {
            "apiVersion": API_VERSION, "kind": "AgentPause", "metadata": {"name": RULES_PAUSE_NAME},
            "spec": {"paused": paused, "reason": reason, "by": me.username,
                     "since": since or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
        try:
            if current is None:
                made: dict[str, Any] = objects.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, "agentpauses", body)
                return made
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            replaced: dict[str, Any] = objects.replace_namespaced_custom_object(
                GROUP, VERSION, namespace, "agentpauses", RULES_PAUSE_NAME, body)
            return replaced
        except kubernetes.client.ApiException as err:
            if err.status != 409:
                raise
    raise click.ClickException(f"{namespace}: the Rules' switch kept changing under this write; try again")
