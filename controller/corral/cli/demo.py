"""`corral demo`: the whole product on this machine until Ctrl-C."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

import click
import kubernetes

from corral.client.errors import api_message
from corral.devcluster import files
from corral.devcluster.demo import Demo, Ready
from corral.devcluster.errors import DevClusterError
from corral.devcluster.plane import DEFAULT_STATE_DIR


@click.command()
@click.option("--kubeconfig", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Use this cluster instead of starting the local plane (a private Mosquitto is started unless --mqtt).")
@click.option("--mqtt", "mqtt_url", help="Use this broker instead of the local one.")
@click.option("--namespace", "-n", default="home", show_default=True, help="Namespace of the simulated home.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port of the MCP gateway (HTTP).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_STATE_DIR,
              show_default=True, help="The local plane's state, the demo's logs and the agent's token.")
def demo(kubeconfig: Path | None, mqtt_url: str | None, namespace: str, port: int, state_dir: Path) -> None:
    """Run everything: control plane and broker, CRDs, a simulated home of 43 devices, the controller and the
    MCP gateway. Prints how to connect kubectl and an MCP client; Ctrl-C stops what it started."""
    run = Demo(state_dir, lambda line: click.echo(f"[demo] {line}", err=True), kubeconfig, mqtt_url, namespace, port)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        ready = run.start()
        click.echo(_instructions(ready), nl=False)
        while True:
            time.sleep(1)
            run.check_children()
    except KeyboardInterrupt:
        click.echo("[demo] stopping what the demo started", err=True)
    except DevClusterError as err:
        raise click.ClickException(str(err)) from None
    except kubernetes.client.ApiException as err:
        raise click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}") from None
    finally:
        run.stop()


def _instructions(ready: Ready) -> str:
    ns = ready.namespace
    local = f"source {ready.kubeconfig.parent / 'env'} && " if ready.own_plane or ready.kubeconfig.name == "kubeconfig" else ""
    approver = f" --context {files.DEV_USER_CONTEXT}" if local else ""
    return f"""
Corral is running: {ready.devices} simulated devices in namespace {ns}, the controller and the MCP gateway.

  kubectl      {local}kubectl get devices -n {ns}   (KUBECONFIG={ready.kubeconfig})
  MCP, HTTP    {ready.gateway_url}
               header  Authorization: Bearer $(cat {ready.token_file})   (ServiceAccount {ns}/agent, agent-operator)
  MCP, stdio   KUBECONFIG={ready.kubeconfig} corral mcp -n {ns}
  approvals    corral intents -n {ns}; corral approve NAME -n {ns}{approver}
  broker       {ready.mqtt_url}

ready (Ctrl-C stops what the demo started)
"""
