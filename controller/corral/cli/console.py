"""`corral console`: the approval page, where people approve or deny Intents from a phone browser.

The kubeconfig (or, in a Pod, the API server's address from the environment and a CA file) gives only the
cluster's address and CA; its credentials are never used. People sign in with their own token.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click
import kubernetes

from corral.api.codes import PEOPLE_NAMESPACE
from corral.gateway.identity import anonymous

IN_CLUSTER_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


def _cluster(kubeconfig: str | None, context: str | None, api_server: str | None, api_ca: str | None
             ) -> tuple[kubernetes.client.Configuration, str | None]:
    """The API server's address and CA, and the kubeconfig context's namespace (None: it names none)."""
    config = kubernetes.client.Configuration()
    if api_server:
        config.host = api_server.rstrip("/")
        config.ssl_ca_cert = api_ca
        return config, None
    try:
        namespace = _cluster_of_kubeconfig(kubeconfig, context, config)
    except (kubernetes.config.ConfigException, OSError, ValueError) as err:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if kubeconfig or not host or not port:
            raise click.ClickException(f"cannot use the kubeconfig: {err} (set KUBECONFIG, --kubeconfig or "
                                       "--api-server)") from None
        # In a Pod, with no ServiceAccount token mounted (the console needs none): the address from the
        # environment, the CA from --api-ca (the chart mounts the kube-root-ca.crt ConfigMap).
        config.host = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        config.ssl_ca_cert = api_ca or IN_CLUSTER_CA
        return config, None
    if api_ca:
        config.ssl_ca_cert = api_ca
    return config, namespace


def _cluster_of_kubeconfig(kubeconfig: str | None, context: str | None,
                           config: kubernetes.client.Configuration) -> str | None:
    """Load the context's cluster (server, CA, TLS settings) into config, and return its namespace.

    Its user is dropped before the kubeconfig is read: no exec plugin runs, no token or key is loaded."""
    from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION, KubeConfigLoader, KubeConfigMerger

    merged = KubeConfigMerger(kubeconfig or KUBE_CONFIG_DEFAULT_LOCATION).config
    if merged is None:
        raise kubernetes.config.ConfigException(f"no kubeconfig at {kubeconfig or KUBE_CONFIG_DEFAULT_LOCATION}")
    for user in merged.value.get("users") or []:
        user.value["user"] = {}
    loader = KubeConfigLoader(config_dict=merged, active_context=context)
    loader.load_and_set(config)
    namespace = (loader.current_context.get("context") or {}).get("namespace")
    return str(namespace) if namespace else None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port to listen on.")
@click.option("--public-url", help="The URL people open (e.g. https://approve.home.example); its origin is the "
                                   "page's, and an https URL makes the session cookie Secure.")
@click.option("--allowed-origin", "allowed_origins", multiple=True, metavar="URL",
              help="Another origin the page is served from (repeatable), e.g. a port-forward's http://localhost:9000.")
@click.option("--namespace", "-n", "namespaces", multiple=True, metavar="NS",
              help="Namespace whose Intents are shown (repeatable); default: the context's, else every namespace "
                   "the person may list Intents in.")
@click.option("--all-namespaces", "-A", is_flag=True, help="Every namespace the person may list Intents in.")
@click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig: only the cluster's address and CA are used.")
@click.option("--context", help="Kubeconfig context to use.")
@click.option("--api-server", metavar="URL", help="The API server's URL, instead of a kubeconfig.")
@click.option("--api-ca", type=click.Path(dir_okay=False), metavar="FILE",
              help="CA certificate of the API server (with --api-server, or in a Pod without a mounted token).")
@click.option("--people-namespace", default=PEOPLE_NAMESPACE, show_default=True, metavar="NS",
              help="The namespace whose ServiceAccounts are people (as `corral run` has it): shown by their name "
                   "(alice), other ServiceAccounts as agents (agent in home).")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging (to stderr).")
def console(host: str, port: int, public_url: str | None, allowed_origins: tuple[str, ...],
            namespaces: tuple[str, ...], all_namespaces: bool, kubeconfig: str | None, context: str | None,
            api_server: str | None, api_ca: str | None, people_namespace: str, verbose: bool) -> None:
    """Serve the approval page: people sign in with their own Kubernetes token and approve or deny the
    Intents waiting for them, as themselves."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from corral.console.app import Settings, serve
    from corral.console.guard import origin_of, own_origins

    if namespaces and all_namespaces:
        raise click.UsageError("give -n NAMESPACE or --all-namespaces, not both")
    if public_url is not None and origin_of(public_url) is None:
        raise click.BadParameter(f"{public_url!r}: an http or https URL", param_hint="--public-url")
    for origin in allowed_origins:
        if origin_of(origin) is None:
            raise click.BadParameter(f"{origin!r}: an http or https URL", param_hint="--allowed-origin")
    if api_ca and not Path(api_ca).is_file():
        raise click.BadParameter(f"{api_ca}: no such file", param_hint="--api-ca")
    config, context_namespace = _cluster(kubeconfig, context, api_server, api_ca)
    served: list[str] | None = None if all_namespaces else list(namespaces) or (
        [context_namespace] if context_namespace else None)
    settings = Settings(
        base=anonymous(config),
        namespaces=served,
        origins=own_origins(public_url, host, port, allowed_origins),
        secure_cookies=bool(public_url and public_url.lower().startswith("https:")),
        public_url=public_url,
        people_namespace=people_namespace,
    )
    shown = public_url or f"http://{host if host not in ('0.0.0.0', '::') else '127.0.0.1'}:{port}/"
    click.echo(f"Approval page: {shown} (API server {config.host}; namespaces: "
               f"{', '.join(served) if served else 'every one the person may list Intents in'})", err=True)
    serve(settings, host, port)
