"""`corral bridge`: bring devices that describe themselves over MQTT (Home Assistant MQTT discovery, zigbee2mqtt)
under Corral's contract, trust and audit. `run` is the bridge process (bridge/runtime.py); other commands of the
group (a source's broker account) are added to `bridge` by their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import click

from corral.cli.bridge_sources import add_account, add_source
from corral.cli.mqttopts import broker_password, password_file_option


@click.group("bridge")
def bridge() -> None:
    """Bridged devices: the bridge process and its sources (docs/bridge.md)."""


bridge.add_command(add_source)
bridge.add_command(add_account)


@bridge.command("run")
@click.option("--mqtt", "mqtt_url", envvar="CORRAL_BRIDGE_MQTT_URL", required=True,
              help="Broker URL with the bridge's username and no password: mqtt://corral-bridge@host:1883 "
                   "(env CORRAL_BRIDGE_MQTT_URL). The password comes from --mqtt-password-file.")
@password_file_option
@click.option("--mqtt-ca", "mqtt_ca", envvar="CORRAL_MQTT_CA", type=click.Path(dir_okay=False, exists=True),
              help="mqtts://: the CA file that signed the broker's certificate (default: the system's).")
@click.option("--namespace", "-n", envvar="CORRAL_BRIDGE_NAMESPACE", required=True,
              help="Where the bridge writes DiscoveredDevices and reads accepted Devices.")
@click.option("--topic-prefix", default="iot", show_default=True, help="Corral's device topic prefix.")
@click.option("--confirm-timeout", type=click.FloatRange(0.1, 300), default=5.0, show_default=True,
              help="Seconds a device has to show a commanded value in a new state message (else the command fails; "
                   "it is never published twice). Keep it below the controller's --command-timeout.")
@click.option("--discovery-prefix", default="homeassistant", show_default=True,
              help="Home Assistant MQTT discovery prefix.")
@click.option("--z2m-base-topic", "z2m_base_topics", multiple=True, default=("zigbee2mqtt",), show_default=True,
              help="A zigbee2mqtt instance's base topic (repeat for several).")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def run(mqtt_url: str, mqtt_password_file: str | None, mqtt_ca: str | None, namespace: str, topic_prefix: str,
        confirm_timeout: float, discovery_prefix: str, z2m_base_topics: tuple[str, ...], verbose: bool) -> None:
    """Run the bridge: discover, offer candidates, speak Corral's device protocol for accepted bridged devices."""
    from dataclasses import replace

    import kubernetes

    from corral.bridge.runtime import Bridge, BridgeSettings
    from corral.devices.link import BrokerAddress, TlsFiles
    from corral.gateway.identity import kubeconfig_configuration
    from corral.kube.client import AsyncApi

    password = broker_password(mqtt_url, mqtt_password_file)
    address = replace(BrokerAddress.parse(mqtt_url), password=password)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = kubeconfig_configuration(None, None)  # KUBECONFIG, ~/.kube/config, or the Pod's ServiceAccount
    except (kubernetes.config.ConfigException, OSError) as err:
        raise click.ClickException(f"no Kubernetes credentials: {err} (set KUBECONFIG or run in a cluster)") from None
    settings = BridgeSettings(namespace=namespace, prefix=topic_prefix, discovery_prefix=discovery_prefix,
                              z2m_base_topics=z2m_base_topics, confirm_timeout_s=confirm_timeout)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        api = AsyncApi(config, connections=4)
        try:
            await Bridge(address, api, settings, TlsFiles(ca_file=mqtt_ca)).run(stop)
        finally:
            await api.close()

    asyncio.run(main())
