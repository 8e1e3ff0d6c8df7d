"""`corral people add NAME`: an identity for a person, who signs in to the approval page with its token.

A home k3s admin's kubeconfig holds a client certificate: there is nothing in it to paste into a browser.
A ServiceAccount in the people namespace (default corral-people) is a person to Corral; agents' roles can
neither mint its tokens nor bind roles there, so an agent cannot become one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import kubernetes

from corral.api.codes import PEOPLE_NAMESPACE
from corral.cli.kubeopts import kube_options
from corral.privatefile import write_private


@click.group()
def people() -> None:
    """People who approve: identities for the approval page."""


APPROVER_ROLE = "corral-approver"  # the chart's and the demo's ClusterRole; examples/rbac/dev-users.yaml's Role


@people.command("add")
@click.argument("name")
@click.option("--people-namespace", default=PEOPLE_NAMESPACE, show_default=True,
              help="The namespace for people (the controller's --people-namespace; the chart's approvals.peopleNamespace).")
@click.option("--approver-role", metavar="ROLE", default=APPROVER_ROLE, show_default=True,
              help="Bind this ClusterRole (or, if there is none of that name, this Role of -n NAMESPACE) to the person "
                   "in -n NAMESPACE: what lets them see and decide the Intents waiting there.")
@click.option("--no-approver-role", is_flag=True,
              help="Bind no role: the person can sign in but sees nothing until someone grants them a role.")
@click.option("--duration", "duration_h", type=click.FloatRange(min=1), default=24 * 30, show_default=True,
              help="Hours the token is good for (the API server may cap it).")
@click.option("--write", "write_to", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the token to this file (mode 0600) instead of printing it.")
@kube_options
def add(client: kubernetes.client.ApiClient, namespace: str, name: str, people_namespace: str,
        approver_role: str, no_approver_role: bool, duration_h: float, write_to: Path | None) -> None:
    """Make NAME a person (a ServiceAccount in the people namespace) who may approve in -n NAMESPACE, and print a
    token to sign in to the approval page with."""
    role_kind = None if no_approver_role else _role_kind(client, namespace, approver_role)
    core = kubernetes.client.CoreV1Api(client)
    _ensure(lambda: core.create_namespace({"metadata": {"name": people_namespace,
                                                        "labels": {"corral.dev/people": "true"}}}))
    _ensure(lambda: core.create_namespaced_service_account(people_namespace, {"metadata": {
        "name": name, "labels": {"corral.dev/person": "true"}}}))
    if role_kind is not None:
        rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        _ensure(lambda: rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": f"{approver_role}-{name}"[:253]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": approver_role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": people_namespace}]}))
    request = {"spec": {"expirationSeconds": int(duration_h * 3600)}}
    token = core.create_namespaced_service_account_token(name, people_namespace, request).status.token
    who = f"system:serviceaccount:{people_namespace}:{name}"
    for line in can_now(name, who, namespace, approver_role if role_kind else None, role_kind):
        click.echo(line, err=True)
    if write_to is not None:
        write_private(write_to, token + "\n")
        click.echo(f"The token to sign in with is in {write_to} (mode 0600).", err=True)
    else:
        click.echo("The token to sign in with (paste it once on the approval page):", err=True)
        click.echo(token)


def can_now(name: str, who: str, namespace: str, role: str | None, role_kind: str | None) -> list[str]:
    """What the new person can do now, in words, and what they cannot yet."""
    lines = [f"{name} is a person to Corral now ({who}), who may:",
             "  - sign in to the approval page (corral console) with the token below"]
    if role is None:
        lines += [f"  and nothing else yet: no role is bound, so the page will show them no Intents. To let them "
                  f"approve in {namespace}: corral people add {name} -n {namespace} (binds {APPROVER_ROLE})"]
        return lines
    return [*lines, f"  - see the Intents waiting in namespace {namespace} and approve or deny them, as themselves "
                    f"({role_kind} {role}, RoleBinding {role}-{name} in {namespace}); never their own requests",
            f"  To let them approve in another namespace too: corral people add {name} -n OTHER"]


def _role_kind(client: kubernetes.client.ApiClient, namespace: str, role: str) -> str:
    """ClusterRole if one of that name exists, else Role if the namespace has one; a clear error if neither does
    (a binding to a missing role grants nothing and would leave the person at a page that shows nothing)."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    for kind, read in (("ClusterRole", lambda: rbac.read_cluster_role(role)),
                       ("Role", lambda: rbac.read_namespaced_role(role, namespace))):
        try:
            read()
            return kind
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
    raise click.ClickException(
        f"there is no ClusterRole {role}, nor a Role {role} in {namespace}, to let the person approve there. Install "
        "Corral's roles (the chart does; corral demo does; or kubectl apply -n NAMESPACE -f "
        "examples/rbac/dev-users.yaml), name another with --approver-role, or add --no-approver-role")


def _ensure(create: Callable[[], object]) -> None:
    """Create it unless it exists already."""
    try:
        create()
    except kubernetes.client.ApiException as err:
        if err.status != 409:
            raise
