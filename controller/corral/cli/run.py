"""`corral run`: the controller."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from datetime import timedelta

import click
import kopf
import kubernetes

from corral.cli.obsopts import observability_options
from corral.decide.decision import Policy
from corral.devices.link import BrokerAddress
from corral.devices.telemetry import Coalescing
from corral.reconcile.config import ControllerConfig
from corral.reconcile.handlers import build_registry
from corral.reconcile.intents import IntentSettings


@click.command()
@observability_options("corral-controller")
@click.option("--mqtt", "mqtt_url", envvar="CORRAL_MQTT_URL", required=True,
              help="Broker URL, mqtt://host:1883 or mqtts://user:pass@host:8883 (env CORRAL_MQTT_URL).")
@click.option("--namespace", "-n", default="default", show_default=True,
              help="Namespace where devices discovered over MQTT are registered.")
@click.option("--watch-namespace", "watch_namespaces", multiple=True, metavar="NS",
              help="Only watch Devices in these namespaces (repeatable); default: all namespaces.")
@click.option("--no-auto-register", is_flag=True, help="Only bind Devices that people created.")
@click.option("--topic-prefix", default="iot", show_default=True, help="MQTT topic prefix.")
@click.option("--command-timeout", type=float, default=5.0, show_default=True, help="Seconds to wait for an ack.")
@click.option("--status-interval", type=float, default=10.0, show_default=True,
              help="At most one sensor status write per device per this many seconds.")
@click.option("--deadband", "deadbands", multiple=True, metavar="METRIC=VALUE",
              help="Absolute change of a metric that is written sooner than the interval (repeatable); "
                   "default: 2% of the sensor's range.")
@click.option("--approvals", "approvals", multiple=True, metavar="RISK=N",
              help="Approvals an Intent of this risk needs (repeatable); default low=0 medium=1 high=1 critical=1.")
@click.option("--freshness", type=float, default=2.0, show_default=True,
              help="Seconds a sensor reading an Intent relies on (basedOn) may be old.")
@click.option("--approval-window", type=float, default=300.0, show_default=True,
              help="Seconds an Intent waits for approval, and an approval stays good.")
@click.option("--intent-timeout", type=float, default=10.0, show_default=True,
              help="Seconds to wait for the device to report an executed Intent's value.")
@click.option("--intent-ttl", type=float, default=86400.0, show_default=True,
              help="Seconds finished Intents are kept before they are deleted.")
@click.option("--health-port", type=int, default=8080, show_default=True,
              help="Port of /healthz (liveness and readiness); 0 turns it off.")
@click.option("--require-signatures", is_flag=True, help="Refuse contracts without a valid Ed25519 signature.")
@click.option("--signing-keys", metavar="NAMESPACE/SECRET",
              help="Secret whose data entries are the trusted contract signing public keys.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def run(
    mqtt_url: str,
    namespace: str,
    watch_namespaces: tuple[str, ...],
    no_auto_register: bool,
    topic_prefix: str,
    command_timeout: float,
    status_interval: float,
    deadbands: tuple[str, ...],
    approvals: tuple[str, ...],
    freshness: float,
    approval_window: float,
    intent_timeout: float,
    intent_ttl: float,
    health_port: int,
    require_signatures: bool,
    signing_keys: str | None,
    verbose: bool,
) -> None:
    """Run the controller: discover devices, mirror contracts, drive devices to their targets."""
    if require_signatures and not signing_keys:
        raise click.UsageError("--require-signatures needs --signing-keys NAMESPACE/SECRET with the trusted keys")
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # kopf reports every handled watch event at INFO; the controller logs what matters itself.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    _load_kube_config()
    config = ControllerConfig(
        mqtt_url=mqtt_url,
        topic_prefix=topic_prefix,
        namespace=namespace,
        auto_register=not no_auto_register,
        watch_namespaces=watch_namespaces,
        command_timeout_s=command_timeout,
        coalescing=Coalescing(interval_s=status_interval, deadbands=_parse_deadbands(deadbands)),
        require_signatures=require_signatures,
        signing_keys_secret=signing_keys,
    )
    try:
        BrokerAddress.parse(mqtt_url)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--mqtt") from None
    if watch_namespaces and namespace not in watch_namespaces:
        raise click.UsageError(f"--namespace {namespace} must be one of the watched namespaces, or its Devices go unseen")
    required = dict(Policy().approvals_required)
    for pair in approvals:
        risk, _, count = pair.partition("=")
        if risk not in required or not count.isdigit():
            raise click.BadParameter(f"{pair!r}: use RISK=N with RISK one of {', '.join(required)}",
                                     param_hint="--approvals")
        required[risk] = int(count)
    intent_settings = IntentSettings(
        policy=Policy(approvals_required=required, freshness=timedelta(seconds=freshness),
                      approval_window=timedelta(seconds=approval_window)),
        execution_timeout_s=intent_timeout,
        ttl=timedelta(seconds=intent_ttl),
    )
    asyncio.run(_operate(config, intent_settings, health_port, list(watch_namespaces)))


def _parse_deadbands(pairs: tuple[str, ...]) -> dict[str, float]:
    parsed = {}
    for pair in pairs:
        metric, _, value = pair.partition("=")
        try:
            parsed[metric.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"{pair!r} is not METRIC=NUMBER, e.g. rssi=6", param_hint="--deadband") from None
        if not metric.strip() or parsed[metric.strip()] < 0:
            raise click.BadParameter(f"{pair!r} needs a metric name and a non-negative number", param_hint="--deadband")
    return parsed


def _load_kube_config() -> None:
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config()
        else:
            kubernetes.config.load_kube_config()
    except (kubernetes.config.ConfigException, OSError) as err:
        raise click.ClickException(f"no Kubernetes credentials: {err} (set KUBECONFIG or run in a cluster)") from None


async def _operate(config: ControllerConfig, intent_settings: IntentSettings, health_port: int,
                   namespaces: list[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await kopf.operator(
        registry=build_registry(config, intent_settings),
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=True,
        liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
        stop_flag=stop,
    )
