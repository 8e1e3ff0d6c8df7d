"""Kubeconfig, context and namespace options shared by the day-to-day commands, as kubectl has them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
import kubernetes

from corral.client.errors import api_message


def kube_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config).")
    @click.option("--context", help="Kubeconfig context to use.")
    @click.option("--namespace", "-n", help="Namespace (default: the context's, else default).")
    @functools.wraps(command)
    def wrapper(kubeconfig: str | None, context: str | None, namespace: str | None, **kwargs: Any) -> Any:
        try:
            client = kubernetes.config.new_client_from_config(config_file=kubeconfig, context=context)
            _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
        except (kubernetes.config.ConfigException, OSError) as err:
            raise click.ClickException(f"cannot use the kubeconfig: {err} (set KUBECONFIG or --kubeconfig)") from None
        if context:
            contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
            active = next((c for c in contexts if c["name"] == context), active)
        default_namespace = (active or {}).get("context", {}).get("namespace") or "default"
        try:
            return command(client=client, namespace=namespace or default_namespace, **kwargs)
        except kubernetes.client.ApiException as err:
            raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None

    return wrapper

