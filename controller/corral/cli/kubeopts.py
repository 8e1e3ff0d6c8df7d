"""Kubeconfig, context and namespace options shared by the day-to-day commands, as kubectl has them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
import kubernetes

from corral.client.errors import api_message


def connect(kubeconfig: str | None, context: str | None, namespace: str | None
            ) -> tuple[kubernetes.client.ApiClient, str]:
    """A client for the kubeconfig (and context), and the namespace to use: the one given, else the context's."""
    try:
        client = kubernetes.config.new_client_from_config(config_file=kubeconfig, context=context)
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError) as err:
        raise click.ClickException(f"cannot use the kubeconfig: {err} (set KUBECONFIG or --kubeconfig)") from None
    if context:
        active = next((c for c in contexts if c["name"] == context), active)
    return client, namespace or (active or {}).get("context", {}).get("namespace") or "default"


def kube_options(command: Callable[..., Any], connected: bool = True) -> Callable[..., Any]:
    """--kubeconfig, --context and -n; the command gets `client` and `namespace` (connected=False: the three
    options as given, for a group that connects only when it runs itself)."""
    @click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config).")
    @click.option("--context", help="Kubeconfig context to use.")
    @click.option("--namespace", "-n", help="Namespace (default: the context's, else default).")
    @functools.wraps(command)
    def wrapper(kubeconfig: str | None, context: str | None, namespace: str | None, **kwargs: Any) -> Any:
        if not connected:
            return command(kubeconfig=kubeconfig, context=context, namespace=namespace, **kwargs)
        client, namespace = connect(kubeconfig, context, namespace)
        try:
            return command(client=client, namespace=namespace, **kwargs)
        except kubernetes.client.ApiException as err:
            raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None

    return wrapper

