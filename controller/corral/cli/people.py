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


@people.command("add")
@click.argument("name")
@click.option("--people-namespace", default=PEOPLE_NAMESPACE, show_default=True,
              help="The namespace for people (the controller's --people-namespace; the chart's approvals.peopleNamespace).")
@click.option("--approver-role", metavar="CLUSTERROLE",
              help="Bind this ClusterRole (e.g. corral-approver) to the person in -n NAMESPACE, so they may approve there.")
@click.option("--duration", "duration_h", type=click.FloatRange(min=1), default=24 * 30, show_default=True,
              help="Hours the token is good for (the API server may cap it).")
@click.option("--write", "write_to", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the token to this file (mode 0600) instead of printing it.")
@kube_options
def add(client: kubernetes.client.ApiClient, namespace: str, name: str, people_namespace: str,
        approver_role: str | None, duration_h: float, write_to: Path | None) -> None:
    """Make NAME a person (a ServiceAccount in the people namespace) and print a token to sign in with."""
    core = kubernetes.client.CoreV1Api(client)
    _ensure(lambda: core.create_namespace({"metadata": {"name": people_namespace,
                                                        "labels": {"corral.dev/people": "true"}}}))
    _ensure(lambda: core.create_namespaced_service_account(people_namespace, {"metadata": {
        "name": name, "labels": {"corral.dev/person": "true"}}}))
    if approver_role:
        rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        _ensure(lambda: rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": f"{approver_role}-{name}"[:253]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": approver_role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": people_namespace}]}))
    request = {"spec": {"expirationSeconds": int(duration_h * 3600)}}
    token = core.create_namespaced_service_account_token(name, people_namespace, request).status.token
    who = f"system:serviceaccount:{people_namespace}:{name}"
    bound = f", {approver_role} in {namespace}" if approver_role else ""
    if write_to is not None:
        write_private(write_to, token + "\n")
        click.echo(f"{who}{bound}: token written to {write_to}", err=True)
    else:
        click.echo(f"{who}{bound}; sign in to the approval page (corral console) with this token:", err=True)
        click.echo(token)


def _ensure(create: Callable[[], object]) -> None:
    """Create it unless it exists already."""
    try:
        create()
    except kubernetes.client.ApiException as err:
        if err.status != 409:
            raise
