"""`corral --help` answers in a blink: the command modules (kubernetes, the MCP SDK, kopf behind them) load only
when their command runs, and the listing the group prints without them says what each command says itself."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from corral.cli.main import COMMANDS, cli

HEAVY = ("kubernetes", "mcp", "kopf", "aiohttp", "pydantic")
PROBE = """
import sys
from corral.cli.main import cli
try:
    cli(ARGS, prog_name="corral")
except SystemExit as stop:
    assert stop.code == 0, stop.code
print(" ".join(sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))))
"""


def _heavy_modules_loaded(args: list[str]) -> set[str]:
    code = PROBE.replace("ARGS", repr(args)).replace("HEAVY", repr(HEAVY))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return set(done.stdout.split("\n")[-2].split())


def test_corral_help_imports_neither_kubernetes_nor_mcp_nor_kopf() -> None:
    assert _heavy_modules_loaded(["--help"]) == set()


def test_the_probe_sees_a_command_that_loads_kubernetes() -> None:
    # The positive control: the same probe, on a command whose module needs the Kubernetes client, sees it load.
    assert "kubernetes" in _heavy_modules_loaded(["intents", "--help"])


def test_the_listing_says_what_each_command_says_of_itself() -> None:
    ctx = click.Context(cli)
    for name, (_, _, listed) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None, name
        assert command.get_short_help_str(limit=1000) == listed, f"update COMMANDS[{name!r}] in corral/cli/main.py"


def test_help_lists_every_command_and_documents_the_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"\n  {name} " in result.output
    assert "3  refused" in result.output and "5  not decided yet" in result.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_is_found_and_has_help(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert f"Usage: cli {name}" in result.output or f"Usage: corral {name}" in result.output


def test_an_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["intent"])
    assert result.exit_code == 2
    assert "No such command 'intent'" in result.output
