"""`corral mcp` (the MCP gateway) and `corral tools` (the tools a caller would see, without an MCP client)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import click
import kubernetes

from corral.api.codes import GATEWAY_AUDIENCE, PEOPLE_NAMESPACE
from corral.audit.component import AuditSettings, open_audit
from corral.audit.keys import AuditKeyError
from corral.audit.log import InUse
from corral.cli.obsopts import observability_options
from corral.client.errors import api_message
from corral.decide.approvals import people_of
from corral.gateway.identity import Caller, kubeconfig_configuration
from corral.gateway.toolset import catalog
from corral.gateway.view import CallerView, Capabilities

log = logging.getLogger(__name__)


def _configuration(kubeconfig: str | None, context: str | None) -> tuple[kubernetes.client.Configuration, str]:
    try:
        config = kubeconfig_configuration(kubeconfig, context)
        try:
            _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
        except kubernetes.config.ConfigException:
            active = None  # in a cluster: no kubeconfig
        if context:
            contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
            active = next((c for c in contexts if c["name"] == context), active)
    except (kubernetes.config.ConfigException, OSError) as err:
        raise click.ClickException(f"cannot use the kubeconfig: {err} (set KUBECONFIG or --kubeconfig)") from None
    return config, ((active or {}).get("context") or {}).get("namespace") or "default"


@click.command()
@observability_options("corral-gateway", host_option="host")
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True,
              help="stdio: act as the kubeconfig's user. http: Streamable HTTP, each request acts as its bearer token.")
@click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig: the cluster (and, for stdio, the caller).")
@click.option("--context", help="Kubeconfig context to use.")
@click.option("--namespace", "-n", "namespaces", multiple=True, metavar="NS",
              help="Namespace whose devices are served (repeatable); default: the context's, else default.")
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="HTTP: port to listen on.")
@click.option("--public-url", help="HTTP: the URL agents use (default http://HOST:PORT/mcp); its host is allowed.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="HOST[:PORT]",
              help="HTTP: another Host header to accept (repeatable), e.g. the Service name.")
@click.option("--issuer-url", help="HTTP: the token issuer named in the protected-resource metadata "
                                   "(default: the API server URL).")
@click.option("--audience", default=GATEWAY_AUDIENCE, show_default=True,
              help="HTTP: accept only bearer tokens (JWTs) whose aud names this (kubectl create token SA --audience "
                   "AUDIENCE); the API server's --api-audiences must include it too.")
@click.option("--readings-url", metavar="URL",
              help="The controller's HTTPS server (e.g. https://corral-controller:8443), for readings where the "
                   "APIService readings.corral.dev is not routed; default: through the API server.")
@click.option("--readings-ca", type=click.Path(dir_okay=False),
              help="CA certificate of --readings-url (the controller's serving-ca.crt; read at first use).")
@click.option("--console-url", metavar="URL",
              help="The approval page (corral console), e.g. https://corral.example; a client with the MCP tasks "
                   "extension and URL-mode elicitation is offered URL/intents/NAMESPACE/NAME while a person must "
                   "approve.")
@click.option("--device-tools", is_flag=True, help="Also publish one tool per device actuator, {device}.{actuator}.{action}.")
@click.option("--people-namespace", default=PEOPLE_NAMESPACE, show_default=True, metavar="NS",
              help="As corral run's: ServiceAccounts in this namespace are people, whom a pause of agents does not "
                   "stop; the gateway refuses others' control calls up front while agents are paused.")
@click.option("--approver-service-account", "approver_service_accounts", multiple=True, metavar="NS/NAME",
              help="As corral run's: a ServiceAccount outside --people-namespace that counts as a person (repeatable).")
@click.option("--wait", "wait_s", type=float, default=10.0, show_default=True,
              help="Seconds iot.control waits for an outcome before answering PENDING.")
@click.option("--rate-limit", default="30/60", show_default=True, metavar="CALLS/SECONDS",
              help="Per caller: at most CALLS control calls (iot.control, device tools) in SECONDS; 0/1 for none.")
@click.option("--max-sessions-per-caller", type=click.IntRange(min=1, max=5000), default=32, show_default=True,
              help="HTTP: open MCP sessions one caller (authenticated username, whatever its tokens) may have; one "
                   "more gets 429 naming the limit, other callers are untouched.")
@click.option("--max-streams-per-caller", type=click.IntRange(min=1), default=64, show_default=True,
              help="HTTP: requests one caller may have open at once (GET streams, waiting calls, listens).")
@click.option("--session-idle", "session_idle_s", type=click.FloatRange(min=0.5), default=300.0, show_default=True,
              help="HTTP: seconds without a client request (an open GET stream does not count) after which a session "
                   "ends, with the leases it holds; the default is a lease's default idle TTL.")
@click.option("--update-interval", type=float, default=1.0, show_default=True,
              help="At most one update notice per resource per this many seconds.")
@click.option("--access-refresh", type=float, default=30.0, show_default=True,
              help="Seconds between reviews of a caller's RBAC rules.")
@click.option("--audit-dir", type=click.Path(file_okay=False),
              help="Keep the gateway's own chained audit log (its refusals) here; one directory per gateway.")
@click.option("--audit-key", type=click.Path(dir_okay=False),
              help="Its Ed25519 signing key (PEM; default AUDIT_DIR/../audit-keys/gateway.pem, made if missing "
                   "unless --no-create-audit-key).")
@click.option("--no-create-audit-key", is_flag=True, help="Refuse to start without the key (the chart mounts a Secret).")
@click.option("--audit-checkpoint", metavar="NAMESPACE/NAME",
              help="The AuditCheckpoint object its checkpoints are published to, with the kubeconfig's identity "
                   "(the gateway's one right: get and update on that object).")
@click.option("--audit-checkpoint-interval", type=click.FloatRange(min=0.5), default=300.0, show_default=True,
              help="Seconds between checkpoints.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging (to stderr).")
def mcp(transport: str, kubeconfig: str | None, context: str | None, namespaces: tuple[str, ...], host: str,
        port: int, public_url: str | None, allowed_hosts: tuple[str, ...], issuer_url: str | None, audience: str,
        readings_url: str | None, readings_ca: str | None, console_url: str | None, device_tools: bool,
        people_namespace: str, approver_service_accounts: tuple[str, ...], wait_s: float, rate_limit: str,
        max_sessions_per_caller: int, max_streams_per_caller: int, session_idle_s: float,
        update_interval: float, access_refresh: float,
        audit_dir: str | None, audit_key: str | None, no_create_audit_key: bool, audit_checkpoint: str | None,
        audit_checkpoint_interval: float, verbose: bool) -> None:
    """Run the MCP gateway: tools from device status, shown only as far as the caller's RBAC allows."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, default_namespace = _configuration(kubeconfig, context)
    served = list(namespaces) or [default_namespace]
    options: dict[str, Any] = {"device_tools_on": device_tools, "min_interval_s": update_interval,
                               "access_refresh_s": access_refresh}
    try:
        options["people"] = people_of(people_namespace, approver_service_accounts)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--approver-service-account") from None
    if readings_ca and not readings_url:
        raise click.UsageError("--readings-ca needs --readings-url")
    from corral.gateway.tasks import valid_console_url
    if console_url is not None and not valid_console_url(console_url):
        raise click.BadParameter(f"{console_url!r}: an http(s) URL with a host, no query", param_hint="--console-url")
    options["console_url"] = console_url
    from corral.gateway.readings import Direct
    direct = Direct(readings_url, readings_ca) if readings_url else None
    from corral.gateway.serve import http_app, serve_http, serve_stdio  # the SDK's server stack loads only here
    from corral.gateway.server import RateLimit

    if not audience.strip() or audience != audience.strip():
        raise click.BadParameter(f"{audience!r}: an audience is a non-empty string without surrounding spaces",
                                 param_hint="--audience")
    calls, _, seconds = rate_limit.partition("/")
    try:
        limit = RateLimit(int(calls), float(seconds))
        if limit.calls < 0 or limit.per_s <= 0:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{rate_limit!r}: use CALLS/SECONDS, e.g. 30/60", param_hint="--rate-limit") from None

    audit = None
    if audit_dir:
        if audit_checkpoint is not None and audit_checkpoint.count("/") != 1:
            raise click.BadParameter(f"{audit_checkpoint!r}: use NAMESPACE/NAME", param_hint="--audit-checkpoint")
        directory = Path(audit_dir)
        settings = AuditSettings(directory, Path(audit_key) if audit_key else directory.parent / "audit-keys" /
                                 "gateway.pem", "gateway", not no_create_audit_key, audit_checkpoint,
                                 audit_checkpoint_interval)
        try:
            audit = open_audit(settings, config, "corral-gateway")
        except (AuditKeyError, InUse) as err:
            raise click.ClickException(f"the audit log: {err}") from None
    elif audit_key or audit_checkpoint:
        raise click.UsageError("--audit-key and --audit-checkpoint need --audit-dir")
    elif transport == "http":
        log.warning("no --audit-dir: the gateway's refusals reach only this log, not a chained audit log")
    if transport == "stdio":
        asyncio.run(serve_stdio(config, served, wait_s=wait_s, rate_limit=limit, audit=audit, readings_direct=direct,
                                **options))
        return
    from corral.gateway.limits import Bounds
    url = public_url or f"http://{host}:{port}/mcp"
    app = http_app(config, served, public_url=url, issuer_url=issuer_url or config.host,
                   allowed_hosts=list(allowed_hosts), wait_s=wait_s, rate_limit=limit, audit=audit,
                   audience=audience, readings_direct=direct,
                   bounds=Bounds(max_sessions_per_caller, max_streams_per_caller, session_idle_s), **options)
    click.echo(f"corral mcp: serving namespaces {', '.join(served)} at {url} (bearer: a Kubernetes token for "
               f"audience {audience}, e.g. kubectl create token SA --audience {audience})", err=True)
    asyncio.run(serve_http(app, host, port, audit))


@click.command()
@click.option("--device", "-d", required=True, help="Device name (or namespace/name).")
@click.option("--as", "as_user", metavar="USER", help="Show what this user would see (impersonation, as kubectl --as).")
@click.option("--as-group", metavar="GROUP", help="Group to impersonate with --as.")
@click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config).")
@click.option("--context", help="Kubeconfig context to use.")
@click.option("--namespace", "-n", help="Namespace (default: the context's, else default).")
def tools(device: str, as_user: str | None, as_group: str | None, kubeconfig: str | None, context: str | None,
          namespace: str | None) -> None:
    """Print the MCP tools a caller would see for one device (the CLI mirror of tools/list)."""
    config, default_namespace = _configuration(kubeconfig, context)
    if "/" in device:
        namespace, _, device = device.partition("/")
    namespace = namespace or default_namespace
    caller = Caller(f"cli:{as_user}", config, impersonate=(as_user, as_group) if as_user else None)
    try:
        rows, who = asyncio.run(_tools_of(caller, namespace, device))
    except kubernetes.client.ApiException as err:
        raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None
    if rows is None:
        raise click.ClickException(f"{who} cannot see a device {namespace}/{device}: it does not exist, or {who} "
                                   "lacks get and the 'read' verb on it")
    width = max(len(r[0]) for r in rows)
    click.echo(f"{'TOOL'.ljust(width)}  HINTS")
    for name, hints in rows:
        click.echo(f"{name.ljust(width)}  {hints}")


async def _tools_of(caller: Caller, namespace: str, device_name: str) -> tuple[list[tuple[str, str]] | None, str]:
    view = CallerView(caller, [namespace], Capabilities(), device_tools_on=True)
    try:
        await view.start()
        device = view.find(f"{namespace}/{device_name}")
        if device is None:
            return None, view.username or "you"
        tools = catalog(view)
        owners = {name: tool.device.id for name, tool in tools.device.items()}
        return tools_for_device(tools.definitions(), owners, device.id), view.username or "you"
    finally:
        view.stop()


def tools_for_device(tools: list[dict[str, Any]], owners: dict[str, str], device_id: str) -> list[tuple[str, str]]:
    """The tools that can act on this device, with their hints: the shared tools whose device_id may name it (or
    that take no device) and its own per-actuator tools, never another device's (`owners`: tool name -> device id)."""
    rows = []
    for tool in tools:
        if tool["name"] in owners:
            if owners[tool["name"]] == device_id:
                rows.append((tool["name"], _hints(tool["annotations"])))
            continue
        ids = tool["inputSchema"].get("properties", {}).get("device_id", {}).get("enum")
        if ids is None or device_id in ids:
            rows.append((tool["name"], _hints(tool["annotations"])))
    return rows


def _hints(annotations: dict[str, Any]) -> str:
    hints = [h for h, key in (("read-only", "readOnlyHint"), ("idempotent", "idempotentHint"),
                              ("destructive", "destructiveHint")) if annotations.get(key)]
    return ", ".join(hints)
