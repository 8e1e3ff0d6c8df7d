"""`corral intents [create]`, `corral approve NAME`, `corral deny NAME`: what people do with requests."""

from __future__ import annotations

import functools
import json
import secrets
import time
from typing import Any, Literal

import click
import kubernetes

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.api.durations import seconds_of
from corral.cli import outcomes
from corral.cli.kubeopts import connect, kube_options
from corral.client.errors import api_message
from corral.client.intents import OwnRequest, decide_on, identity, outcome_code, submit, wait_settled
from corral.contract.text import written_text
from corral.contract.values import shown

EXIT_STATUS = """\b
Exit status: 0 EXECUTED; 3 refused (DENY_*, DENIED_BY_APPROVER, RATE_LIMITED, CANCELLED); 4 allowed but not
done (FAILED, TIMEOUT, DEVICE_GONE); 5 not decided yet (AWAITING_APPROVAL, or PENDING when --wait ran out);
1 an error before any outcome; 2 a bad option or argument. A dry run: 0 it would execute or wait for a person,
3 it would be refused."""
DECISION_STATUS = """\b
Exit status: 0 the controller took your decision; 3 it refused your Approval (your own request, no approve
verb, not a person, ...: the message says why) and the Intent keeps waiting; 5 no verdict within --wait;
1 the Intent is not waiting for approval, or another error; 2 a bad option or argument."""


class Refused(click.ClickException):
    """A refusal the person can act on (the message says what to do), with its own exit status."""

    exit_code = outcomes.REFUSED


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
        rows.append((item["metadata"]["name"], spec["device"], change_text(spec),
                     status.get("risk") or "-", status.get("phase") or "Pending", status.get("code") or "-",
                     spec["requester"], written_text(spec.get("reason"))))  # an agent's words, made safe to read
    if not rows:
        click.echo("No Intents are waiting for approval." if not show_all else "No Intents.", err=True)
        return
    header = ("NAME", "DEVICE", "CHANGE", "RISK", "PHASE", "CODE", "REQUESTER", "REASON")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + str(row[-1]))


@intents.command(epilog=EXIT_STATUS)
@click.argument("device")
@click.argument("change", metavar="ACTUATOR=VALUE")
@click.option("--action", help="The actuator's action (default: the one its contract names).")
@click.option("--reason", required=True, help="Why, in a sentence (audited).")
@click.option("--name", help="The Intent's name, its idempotency key (default: a new one).")
@click.option("--based-on", "based_on", multiple=True, metavar="METRIC@TS",
              help="A sample the request relies on, as `corral readings` shows it (repeatable).")
@click.option("--dry-run", is_flag=True, help="Run every check and print the outcome it would have; execute nothing.")
@click.option("--hold-for", "hold_for", metavar="DURATION",
              help="A timed hold (e.g. 20m, 1h30m): once done, the value from before is put back after this long.")
@click.option("--then", "then", metavar="VALUE", help="With --hold-for: the value to put back instead (JSON, or a word).")
@click.option("--wait", "wait_s", type=float, default=15.0, show_default=True, help="Seconds to wait for the outcome.")
@kube_options
def create(client: kubernetes.client.ApiClient, namespace: str, device: str, change: str, action: str | None,
           reason: str, name: str | None, based_on: tuple[str, ...], dry_run: bool, hold_for: str | None,
           then: str | None, wait_s: float) -> None:
    """Ask DEVICE for ACTUATOR=VALUE (a JSON value: true, 21.5, "auto"), in your own name, and print the outcome."""
    actuator, sep, text = change.partition("=")
    if not sep or not actuator:
        raise click.BadParameter(f"{change!r}: use ACTUATOR=VALUE, e.g. power=true", param_hint="ACTUATOR=VALUE")
    value = _value_of(text)
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
    if then is not None and hold_for is None:
        raise click.BadParameter("--then is the value after a hold: give --hold-for too", param_hint="--then")
    if hold_for is not None:
        try:
            seconds_of(hold_for)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--hold-for") from None
        spec["holdFor"] = hold_for
        if then is not None:
            spec["then"] = {"value": _value_of(then)}
    name = name or f"cli-{'dry-' if dry_run else ''}{secrets.token_hex(6)}"
    submitted = submit(client, namespace, name, spec)
    if submitted.code == "DENY_ID_CONFLICT":
        raise Refused(f"DENY_ID_CONFLICT: {submitted.message}")
    status = wait_settled(client, namespace, name, wait_s).get("status") or {}
    checked_only = " (dry run)" if status.get("phase") == "DryRun" else ""
    code = outcome_code(status)
    message = status.get("message") or (f"No outcome within {wait_s:g} s; see `corral intents --all -n {namespace}`."
                                        if code == "PENDING" else "")
    click.echo(f"{name}: {code}{checked_only}: {message}")
    if checked_only and code in ("AWAITING_APPROVAL", "PENDING"):
        return  # a dry run is decided once it is checked: waiting for a person is an answer, not a refusal
    click.get_current_context().exit(outcomes.exit_status(code))


def change_text(spec: dict[str, Any]) -> str:
    """What an Intent asks, as people write it: `locked=true`, and a timed hold with what it puts back after it
    (`locked=true for 8s, then locked=false`), since an approval covers both; made safe to read (an agent wrote it)."""
    actuator = spec.get("actuator")
    if spec.get("action") == "read":
        return written_text(f"read {actuator}")
    change = f"{actuator}={shown((spec.get('params') or {}).get('value'))}"
    if spec.get("holdFor") is not None:
        then = spec.get("then")
        back = f"{actuator}={shown(then.get('value'))}" if isinstance(then, dict) else "the value from before"
        change += f" for {spec['holdFor']}, then {back}"
    return written_text(change)


def _value_of(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word is a string: mode=auto


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


WAIT_OPTION = click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=5.0, show_default=True,
                           help="Seconds to wait for the controller's verdict on your decision (0: do not wait).")


@click.command(epilog=DECISION_STATUS)
@click.argument("name")
@click.option("--reason", default="", help="Why, in a sentence.")
@WAIT_OPTION
@kube_options
def approve(client: kubernetes.client.ApiClient, namespace: str, name: str, reason: str, wait_s: float) -> None:
    """Approve Intent NAME, in your own name, for exactly its current parameters."""
    _decide(client, namespace, name, "Approve", reason, wait_s)


@click.command(epilog=DECISION_STATUS)
@click.argument("name")
@click.option("--reason", default="", help="Why, in a sentence (the requester sees it).")
@WAIT_OPTION
@kube_options
def deny(client: kubernetes.client.ApiClient, namespace: str, name: str, reason: str, wait_s: float) -> None:
    """Deny Intent NAME, in your own name."""
    _decide(client, namespace, name, "Deny", reason, wait_s)


def _decide(client: kubernetes.client.ApiClient, namespace: str, name: str, decision: Literal["Approve", "Deny"],
            reason: str, wait_s: float) -> None:
    try:
        shown_intent = kubernetes.client.CustomObjectsApi(client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "intents", name)
        approval = decide_on(client, namespace, name, decision, reason,
                             expected_uid=shown_intent["metadata"]["uid"])
    except OwnRequest as err:
        raise Refused(str(err)) from None
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    except kubernetes.client.ApiException as err:
        raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None
    made, me = approval["metadata"]["name"], approval["spec"]["approver"]
    verb = "approval" if decision == "Approve" else "denial"
    spec = shown_intent["spec"]
    # Exactly what the Approval binds to (its paramsHash covers a hold's then too), in the words of `corral intents`.
    click.echo(f"{name}: {verb} of {spec['device']}: {change_text(spec)}, asked by {written_text(spec['requester'])}")
    if wait_s <= 0:
        click.echo(f"{name}: {verb} by {me} made (Approval {made}); not waiting for the controller's verdict")
        return
    refusal, intent = _verdict(client, namespace, made, name, wait_s)
    if refusal is not None:
        raise Refused(f"Approval {made} by {me} does not count: {refusal}. Intent {name} keeps waiting for a decision "
                      "that counts.")
    status = (intent or {}).get("status") or {}
    if status.get("phase") in (None, "AwaitingApproval"):
        click.echo(f"{name}: {verb} by {me} made (Approval {made}), but the controller gave no verdict within "
                   f"{wait_s:g} s (is it running?); see `corral intents --all -n {namespace}`")
        click.get_current_context().exit(outcomes.UNDECIDED)
    code = outcome_code(status)
    verb = "approved" if decision == "Approve" else "denied"
    now = f"ended {code}" if status.get("phase") in FINAL_PHASES else f"is {str(status.get('phase')).lower()} now"
    click.echo(f"{name} {verb} by {me} (Approval {made}); the controller took it: the Intent {now}: "
               f"{status.get('message', '')}")
    if code == "PENDING" or (decision == "Deny" and code == "DENIED_BY_APPROVER"):
        return  # executing now, or denied as asked
    click.get_current_context().exit(outcomes.exit_status(code))  # ran (0), or ended otherwise (the code says how)


def _verdict(client: kubernetes.client.ApiClient, namespace: str, approval: str, intent: str, wait_s: float,
             poll_s: float = 0.05) -> tuple[str | None, dict[str, Any] | None]:
    """The controller's answer to an Approval: why it was refused (and nothing else), or the Intent once it no
    longer waits for approval; (None, the Intent as it is) if neither came within wait_s."""
    objects = kubernetes.client.CustomObjectsApi(client)
    deadline = time.monotonic() + wait_s
    while True:
        status = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "approvals", approval).get("status") or {}
        if status.get("refused"):
            return str(status.get("message") or "the controller refused it"), None
        body = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "intents", intent)
        if ((body.get("status") or {}).get("phase") or "AwaitingApproval") != "AwaitingApproval" \
                or time.monotonic() > deadline:
            return None, body
        time.sleep(poll_s)
