"""`corral readings DEVICE`: the timestamped samples the controller received from a device.

By default through the API server (the APIService readings.corral.dev), with whatever credential the
kubeconfig holds; `--server URL` asks the controller's HTTPS server directly with a bearer token, where the
APIService is not routed. Either way the controller answers only callers holding `listen` on the Device.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click
import kubernetes

from corral.api.codes import READINGS_MAX_WINDOW_S, READINGS_PREFIX
from corral.cli.audit import Source, bearer_of
from corral.cli.kubeopts import kube_options
from corral.cli.tokenopts import token_options
from corral.client.errors import api_message
from corral.contract.values import shown as shown_value


@click.command()
@click.argument("device")
@click.option("--window", "window_s", type=click.FloatRange(0, READINGS_MAX_WINDOW_S), default=60.0, show_default=True,
              help="Seconds back from now (0: only the newest sample of each metric).")
@click.option("--metric", "metrics", multiple=True, help="Only this metric (repeatable).")
@click.option("--server", help="The controller's HTTPS server, instead of the API server's APIService.")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="--server: the CA of its certificate.")
@token_options("a bearer token")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@kube_options
def readings(client: kubernetes.client.ApiClient, namespace: str, device: str, window_s: float,
             metrics: tuple[str, ...], server: str | None, ca_file: str | None, token: str | None, output: str) -> None:
    """Print DEVICE's samples: the device's ts (cite it as --based-on METRIC@TS), the value and its age."""
    path = f"{READINGS_PREFIX}/namespaces/{namespace}/devices/{device}"
    query = {"window_s": f"{window_s:g}", **({"metrics": ",".join(metrics)} if metrics else {})}
    if server:
        source = Source(None, server, ca_file, token or bearer_of(client.configuration), None, None)
        document = json.loads(source.get(path, query))
    else:
        try:
            data, _, _ = client.call_api(path, "GET", query_params=list(query.items()), auth_settings=["BearerToken"],
                                         response_type="object", _return_http_data_only=False)
        except kubernetes.client.ApiException as err:
            hint = " (no APIService readings.corral.dev here? try --server)" if err.status in (404, 503) else ""
            raise click.ClickException(f"the API server answered {err.status}: {api_message(err)}{hint}") from None
        document = data
    if output == "json":
        click.echo(json.dumps(document, indent=1))
        return
    _print(document)


def _print(document: dict[str, Any]) -> None:
    shown = document.get("metrics") or {}
    if not shown:
        click.echo(f"No samples of {document['metadata']['name']} in the last {document.get('windowSeconds', 0):g} s "
                   "(the controller keeps them in memory: a restarted controller has none until the device sends).",
                   err=True)
        return
    click.echo(f"{'METRIC':<16} {'TS':<14} {'AT (device clock)':<24} {'VALUE':<12} AGE")
    for metric, item in shown.items():
        unit = item.get("unit") or ""
        for sample in item.get("samples") or []:
            at = datetime.fromtimestamp(sample["ts"] / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
            value = f"{shown_value(sample['value'])}{unit}"
            click.echo(f"{metric:<16} {sample['ts']:<14} {at:<24} {value:<12} {sample['ageSeconds']:.1f} s")
