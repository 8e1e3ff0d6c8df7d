"""`corral demo`: the whole product on this machine until Ctrl-C or SIGTERM; `--node` as a k3s user runs it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

import click
import kubernetes

from corral.api.codes import GATEWAY_AUDIENCE
from corral.cli.mqttopts import broker_password, password_file_option
from corral.client.errors import api_message
from corral.devcluster import files
from corral.devcluster.demo import Demo, Ready
from corral.devcluster.errors import DevClusterError
from corral.devcluster.nodedemo import NodeDemo, NodeReady
from corral.devcluster.plane import DEFAULT_STATE_DIR


class Stop(BaseException):  # like KeyboardInterrupt, which no `except Exception` swallows
    """SIGINT or SIGTERM: stop what the demo started."""


class Progress:
    """Lines for the person watching, on stderr and in the demo's log.

    The shutdown must never depend on stderr: with `./scripts/up 2>&1 | tee demo.log`, Ctrl-C ends `tee`
    too, and every later write to the pipe fails. Then the lines go on to the log file only.
    """

    def __init__(self, log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log: TextIO = open(log, "a", buffering=1)  # noqa: SIM115 - written until the demo ends
        self._terminal_gone = False

    def __call__(self, line: str) -> None:
        text = f"[demo] {line}"
        with contextlib.suppress(OSError, ValueError):
            self._log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
        if not self._terminal_gone:
            try:
                click.echo(text, err=True)
            except OSError:
                self._terminal_gone = True


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


@click.command()
@click.option("--kubeconfig", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Use this cluster instead of starting the local plane (a private Mosquitto is started unless --mqtt).")
@click.option("--mqtt", "mqtt_url", help="Use this broker instead of the local one: the controller's account by "
                                          "name only, mqtt://USER@HOST:PORT (the password: --mqtt-password-file).")
@password_file_option
@click.option("--namespace", "-n", default="home", show_default=True, help="Namespace of the simulated home.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port of the MCP gateway (HTTP).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_STATE_DIR,
              show_default=True, help="The local plane's state, the demo's logs and the agent's token.")
@click.option("--node", is_flag=True,
              help="Run it as a k3s user does (root): on the real node of this machine (corral dev up --node), the "
                   "chart installed by helm with charts/corral/values-k3s.yaml and the images built here, the "
                   "simulated home connecting through the node's ports.")
@click.pass_context
def demo(ctx: click.Context, kubeconfig: Path | None, mqtt_url: str | None, mqtt_password_file: str | None,
         namespace: str, port: int, state_dir: Path, node: bool) -> None:
    """Run everything: control plane and broker, CRDs, a simulated home of 43 devices, the controller and the
    MCP gateway. Prints how to connect kubectl and an MCP client; Ctrl-C (or SIGTERM) stops what it started."""
    if node:
        given = [f"--{name.replace('_', '-')}" for name in ("kubeconfig", "mqtt_url", "mqtt_password_file",
                                                           "namespace", "port")
                 if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"--node installs the chart on this machine's node in namespace corral with its "
                                   f"node ports: {', '.join(given).replace('--mqtt-url', '--mqtt')} cannot be "
                                   f"combined with it (only --state-dir can)")
    if mqtt_url is not None:
        broker_password(mqtt_url, mqtt_password_file)  # refused now, not after the plane started
    progress = Progress(state_dir / "demo-logs" / "demo.log")
    run: Demo | NodeDemo
    if node:
        run = NodeDemo(state_dir, progress)
    else:
        run = Demo(state_dir, progress, kubeconfig, mqtt_url, namespace, port,
                   mqtt_password_file=Path(mqtt_password_file).resolve() if mqtt_password_file else None)
    # Explicit handlers for both: a demo started with SIGINT ignored (a background job of a non-interactive
    # shell, nohup, some CI runners) would otherwise never hear Ctrl-C, and SIGTERM would kill it outright.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop_on_signal)
    failure: click.ClickException | None = None
    try:
        ready = run.start()
        _say(sys.stdout, _node_instructions(ready) if isinstance(ready, NodeReady) else _instructions(ready))
        while True:
            time.sleep(1)
            run.check_children()
    except Stop as why:
        progress(f"{why}: stopping what the demo started")
    except DevClusterError as err:
        failure = click.ClickException(str(err))
    except kubernetes.client.ApiException as err:
        failure = click.ClickException(f"the API server refused: {err.status} {err.reason}: {api_message(err)}")
    finally:
        run.stop()
        progress("stopped")
    if failure is not None:
        raise failure
    _quiet_exit()


def _say(stream: TextIO, text: str) -> None:
    with contextlib.suppress(OSError):
        stream.write(text)
        stream.flush()


def _quiet_exit() -> None:
    """Exit 0 even when stdout is a pipe nobody reads any more (its final flush would fail)."""
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.dup2(devnull, sys.stderr.fileno())


def _instructions(ready: Ready) -> str:
    ns = ready.namespace
    local = f"source {ready.kubeconfig.parent / 'env'} && " if ready.own_plane or ready.kubeconfig.name == "kubeconfig" else ""
    approver = f" --context {files.DEV_USER_CONTEXT}" if local else ""
    corral = _corral_command()
    return f"""
Corral is running: {ready.devices} simulated devices in namespace {ns}, the controller and the MCP gateway.

  kubectl      {local}kubectl get devices -n {ns}   (KUBECONFIG={ready.kubeconfig})
  MCP, HTTP    {ready.gateway_url}
               header  Authorization: Bearer $(cat {ready.token_file})   (ServiceAccount {ns}/agent, agent-operator)
               another token: kubectl create token agent -n {ns} --audience {GATEWAY_AUDIENCE}
  MCP, stdio   KUBECONFIG={ready.kubeconfig} {corral} mcp -n {ns}
  approvals    {corral} intents -n {ns}; {corral} approve NAME -n {ns}{approver}
  broker       {ready.mqtt_url}

ready (Ctrl-C stops what the demo started)
"""


def _node_instructions(ready: NodeReady) -> str:
    ns = ready.namespace
    corral = _corral_command()
    after = " and the node the demo started" if ready.own_node else "; the node was running before and stays up"
    return f"""
Corral is running on the node {ready.node_name} ({ready.node_ip}) as a k3s user installs it: helm release corral of
charts/corral with values-k3s.yaml in namespace {ns}, the images built here; {ready.devices} simulated devices on this
machine connected through the node's broker port.

  kubectl      source {ready.env_file} && kubectl get pods,devices -n {ns}
  MCP, HTTP    {ready.mcp_url}
               header  Authorization: Bearer $(cat {ready.agent_token})   (ServiceAccount {ns}/agent, agent-operator)
  approvals    {ready.console_url}   sign in with the token in {ready.person_token} ({ready.person})
               or: {corral} intents -n {ns}
  broker       {ready.mqtt_url}   (CA {ready.broker_ca})
  helm         {ready.helm} status corral -n {ns}   (KUBECONFIG={ready.kubeconfig})

ready (Ctrl-C stops the simulated home{after})
"""


def _corral_command() -> str:
    """The `corral` beside this interpreter (the checkout's .venv/bin/corral): the env file puts only kubectl on PATH,
    so a bare `corral` in the instructions would not be found."""
    beside = Path(sys.executable).with_name("corral")
    return str(beside) if beside.exists() else "corral"
