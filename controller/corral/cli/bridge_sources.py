"""`corral bridge add-source` and `corral bridge add-account`: a person registering what the bridge may speak for.

Wired into the `corral bridge` group by cli/bridge.py. The controller keeps the broker accounts these Secrets ask for
(devices.bridge_accounts); nothing here talks to the broker.
"""

from __future__ import annotations

import click
import kubernetes

from corral.cli.kubeopts import kube_options
from corral.client import bridge as bridging
from corral.devices.bridge_accounts import DEFAULT_BRIDGE_USERNAME, DEFAULT_DISCOVERY_PREFIX


@click.command("add-source")
@click.argument("name")
@click.option("--kind", type=click.Choice(["ha", "zigbee2mqtt"]), required=True,
              help="ha: a Home Assistant MQTT discovery node (ESPHome, OpenMQTTGateway, ...); zigbee2mqtt: an instance.")
@click.option("--node", help="ha: the node id in its discovery topics (homeassistant/<component>/<node>/...).")
@click.option("--base-topic", help="zigbee2mqtt: its base topic (default zigbee2mqtt).")
@click.option("--topic-root", help="ha: the root its devices' state and command topics are under (default: the node "
                                   "id). zigbee2mqtt: always its base topic.")
@click.option("--discovery-prefix", default=DEFAULT_DISCOVERY_PREFIX, show_default=True,
              help="ha: the discovery prefix it announces under.")
@click.option("--topic-prefix", default="iot", show_default=True,
              help="Corral's device topic prefix (the controller's --topic-prefix, the chart's mqtt.topicPrefix): the "
                   "source's topic root may not overlap it.")
@kube_options
def add_source(client: kubernetes.client.ApiClient, namespace: str, name: str, kind: str, node: str | None,
               base_topic: str | None, topic_root: str | None, discovery_prefix: str, topic_prefix: str) -> None:
    """Register bridged source NAME and print its broker username and password (shown once).

    Its broker account may publish only its discovery topics, and the state and availability topics of devices a
    person accepted (corral devices accept-discovered): a state on their topics can only come from it. Its topic
    root may not overlap Corral's device topics, a discovery prefix or another source's root; the controller reads
    source Secrets only in the namespaces it is told (corral run --bridge-namespace).

    \b
    corral bridge add-source zigbee --kind zigbee2mqtt --base-topic zigbee2mqtt -n home
    corral bridge add-source porch --kind ha --node porch-node -n home
    """
    if kind == "ha" and (not node or base_topic):
        raise click.UsageError("--kind ha takes --node (and no --base-topic)")
    if kind == "zigbee2mqtt" and (node or topic_root):
        raise click.UsageError("--kind zigbee2mqtt takes --base-topic (and no --node or --topic-root)")
    identity = node if kind == "ha" else (base_topic or "zigbee2mqtt")
    assert identity is not None
    try:
        username, password = bridging.add_source(client, namespace, name, kind, identity,
                                                 topic_root if kind == "ha" else None, discovery_prefix, topic_prefix)
    except bridging.BridgeError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"username   {username}\npassword   {password}")
    click.echo(f"Registered source {name} in {namespace} (Secret {bridging.source_secret_name(name)}). Configure it "
               "to connect with this username (also its client id) and password; the password is shown once here.",
               err=True)


@click.command("add-account")
@click.option("--username", default=DEFAULT_BRIDGE_USERNAME, show_default=True, help="The bridge's broker username.")
@kube_options
def add_account(client: kubernetes.client.ApiClient, namespace: str, username: str) -> None:
    """Make the bridge's broker identity for the bridged Devices of the namespace (the chart makes its own)."""
    try:
        username, password = bridging.add_account(client, namespace, username)
    except bridging.BridgeError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"username   {username}\npassword   {password}")
    click.echo(f"`corral bridge run -n {namespace}` connects with them (--mqtt-password-file); shown once here.",
               err=True)
