"""`corral rules`: Rules as people govern them: list, show (with the diff against the kept revision), accept an
agent's revision, restore the previous one, and pause or resume every Rule of a namespace.

Accept and restore print the exact spec and act only on a revision the controller recorded, bound to the revision
shown (`--generation`, or typed at a terminal: rule_review.py). Accepting writes the annotation corral.dev/accepted =
"<generation>:<your username>"; the API server admits it only while that is the Rule's current generation, and only
with your `approve` verb on the Rule, so an edit in between is refused. (No resourceVersion precondition: the
controller's status writes change it every few seconds, and they do not change what you accept.) A restore is
written with the resourceVersion read, tried again only while the generation and the kept revision are the ones
shown. The Rules' switch is the AgentPause named `rules` (api/pause.py RULES_PAUSE_NAME): the agents' switch
does not stop a person's Rules, this one stops all of them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
import kubernetes
from pydantic import ValidationError

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.pause import RULES_PAUSE_NAME, paused_of
from corral.api.rule import ACCEPTED_ANNOTATION, PREVIOUS_SPEC_ANNOTATION, Rule
from corral.cli.kubeopts import kube_options
from corral.cli.rule_review import bind, echo_diff, echo_spec, kept_line, refuse_early, whose
from corral.client.errors import api_message
from corral.client.intents import identity
from corral.contract.text import written_text
from corral.decide.approvals import DEFAULT_PEOPLE
from corral.decide.revisions import acceptance, accepted_value, previous_spec, previous_spec_hash, spec_document
from corral.decide.rules import Restore, current_on_record, restore_plan

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
    echo_spec(rule.spec)
    kept = previous_spec(meta.annotations)
    if kept is None:
        click.echo("No previous revision is kept.")
        return
    click.echo(kept_line(rule) or "")
    click.echo(f"Changes against it (corral rules restore {name} --generation {meta.generation} puts it back):")
    echo_diff(kept, rule.spec, "previous", "current")


@rules.command("accept")
@click.argument("name")
@click.option("--generation", type=click.IntRange(min=1),
              help=("The revision you accept, as `corral rules show` printed it; refused if the Rule is at another. "
                    "Required when not interactive; at a terminal, the revision is shown and you type its number."))
@kube_options
def accept(client: kubernetes.client.ApiClient, namespace: str, name: str, generation: int | None) -> None:
    """Accept NAME's current revision in your name, as shown: an agent's revision acts only once a person accepts it."""
    me = identity(client)
    rule = _rule(client, namespace, name)[1]
    current = rule.metadata.generation or 0
    refuse_early(name, current, generation, "accept")
    try:
        revision = current_on_record(rule)
    except ValueError as err:
        raise click.ClickException(f"Rule {name}: {err}") from None
    click.echo(f"Accepting Rule {namespace}/{name}, {whose(revision)}; it acts as {rule.spec.service_account_name}:")
    echo_spec(rule.spec)
    kept = previous_spec(rule.metadata.annotations)
    if kept is not None:
        click.echo(kept_line(rule) or "")
        echo_diff(kept, rule.spec, "previous", f"revision {current}")
    bind(name, current, generation, "accept")
    # The API server admits exactly "<the current generation>:<you>": an edit since the read makes it refuse.
    patch = {"metadata": {"annotations": {ACCEPTED_ANNOTATION: accepted_value(current, me.username)}}}
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
@click.option("--generation", type=click.IntRange(min=1),
              help=("The Rule's current revision, as `corral rules show` printed it with the kept one; refused if it "
                    "is at another. Required when not interactive; at a terminal, you type it after reading."))
@kube_options
def restore(client: kubernetes.client.ApiClient, namespace: str, name: str, generation: int | None) -> None:
    """Put NAME's previous revision back, as your revision, as shown (the replaced one is kept: restoring toggles).
    Only a revision the controller recorded as the Rule's spec is restored."""
    me = identity(client)
    body, rule = _rule(client, namespace, name)
    current = rule.metadata.generation or 0
    refuse_early(name, current, generation, "restore")
    try:
        plan = restore_plan(rule, me.username, me.groups)
    except ValueError as err:
        raise click.ClickException(f"Rule {name}: {err}") from None
    click.echo(f"Restoring {whose(plan.revision)} of Rule {namespace}/{name} over revision {current} by "
               f"{rule.spec.author}. It becomes your revision and acts at once as {rule.spec.service_account_name}:")
    echo_spec(plan.spec)
    echo_diff(rule.spec, plan.spec, f"revision {current} (current)", "restored")
    bind(name, current, generation, "restore")
    written = _replace_as_read(client, namespace, name, body, plan, rule)
    click.echo(f"{name}: revision {plan.revision.generation} restored as revision "
               f"{written['metadata'].get('generation')} by {me.username}")


def _replace_as_read(client: kubernetes.client.ApiClient, namespace: str, name: str, body: dict[str, Any],
                     plan: Restore, shown: Rule) -> dict[str, Any]:
    """Write the restore with the resourceVersion read. The controller's status writes move it every few seconds:
    a conflict is tried again only while the Rule is still the revision shown with the same kept revision."""
    for _ in range(WRITE_ATTEMPTS):
        replaced = {key: value for key, value in body.items() if key != "status"}
        replaced["metadata"] = {**body["metadata"], "annotations": {**(body["metadata"].get("annotations") or {}),
                                                                    PREVIOUS_SPEC_ANNOTATION: plan.kept}}
        replaced["spec"] = spec_document(plan.spec)
        try:
            written: dict[str, Any] = _objects(client).replace_namespaced_custom_object(
                GROUP, VERSION, namespace, "rules", name, replaced)
            return written
        except kubernetes.client.ApiException as err:
            if err.status != 409:
                raise click.ClickException(f"the API server refused: {err.status} {err.reason}: "
                                           f"{api_message(err)}") from None
        body, now = _rule(client, namespace, name)
        if now.metadata.generation != shown.metadata.generation or previous_spec_hash(
                now.metadata.annotations) != previous_spec_hash(shown.metadata.annotations):
            raise click.ClickException(f"Rule {name} changed since you were shown it (now revision "
                                       f"{now.metadata.generation}); nothing was restored. Read it again.")
    raise click.ClickException(f"Rule {name} kept changing under this write; nothing was restored. Try again.")


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
