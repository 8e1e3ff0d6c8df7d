"""Entry point of the `corral` command: a click group, with one module per command family."""

from __future__ import annotations

import click

from corral import __version__
from corral.cli.agents import agents
from corral.cli.audit import audit
from corral.cli.broker import broker
from corral.cli.console import console
from corral.cli.crds import crds
from corral.cli.demo import demo
from corral.cli.dev import dev
from corral.cli.devices import devices
from corral.cli.grants import grants
from corral.cli.intents import approve, deny, intents
from corral.cli.lease import lease
from corral.cli.mcp import mcp, tools
from corral.cli.people import people
from corral.cli.readings import readings
from corral.cli.run import run
from corral.cli.secrets import secrets
from corral.cli.sim import sim


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """Corral: let AI agents operate physical devices safely."""


cli.add_command(agents)
cli.add_command(audit)
cli.add_command(broker)
cli.add_command(console)
cli.add_command(crds)
cli.add_command(demo)
cli.add_command(dev)
cli.add_command(devices)
cli.add_command(grants)
cli.add_command(intents)
cli.add_command(lease)
cli.add_command(approve)
cli.add_command(deny)
cli.add_command(mcp)
cli.add_command(people)
cli.add_command(readings)
cli.add_command(run)
cli.add_command(secrets)
cli.add_command(sim)
cli.add_command(tools)


def main() -> None:
    cli(prog_name="corral")


if __name__ == "__main__":  # pragma: no cover
    main()
