"""Entry point of the `corral` command: a click group, with one module per command family.

Commands are imported only when they run: `corral --help` must answer in a blink, and the modules behind the
commands pull in kubernetes, the MCP SDK, kopf and aiohttp (about a second on a small machine). Each command's
one-line help is written here for the listing; a unit test holds it equal to the command's own.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from corral import __version__

# name -> (module, attribute, the command's one-line help as `corral --help` lists it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "agents": ("corral.cli.agents", "agents",
               "The agents kill switch: stop every agent at once (people keep control), and let them act again."),
    "approve": ("corral.cli.intents", "approve",
                "Approve Intent NAME, in your own name, for exactly its current parameters."),
    "audit": ("corral.cli.audit", "audit", "The audit log: prove it untouched, read it."),
    "broker": ("corral.cli.broker", "broker", "Prepare a Mosquitto broker for Corral (dynamic security plugin)."),
    "bridge": ("corral.cli.bridge", "bridge",
               "Bridged devices: the bridge process and its sources (docs/bridge.md)."),
    "console": ("corral.cli.console", "console",
                "Serve the approval page: people sign in with their own Kubernetes token and approve or deny the "
                "Intents waiting for them, as themselves."),
    "contracts": ("corral.cli.contracts", "contracts", "Sign device contracts (signing keys, signed firmware builds)."),
    "crds": ("corral.cli.crds", "crds",
             "Generate CustomResourceDefinitions and ValidatingAdmissionPolicies from the API models."),
    "demo": ("corral.cli.demo", "demo",
             "Run everything: control plane and broker, CRDs, a simulated home of 43 devices, the controller and the "
             "MCP gateway."),
    "deny": ("corral.cli.intents", "deny", "Deny Intent NAME, in your own name."),
    "dev": ("corral.cli.dev", "dev", "Local control plane (kube-apiserver + etcd) and Mosquitto broker."),
    "devices": ("corral.cli.devices", "devices",
                "Enroll devices (a device is trusted only once a person enrolls it), rotate or revoke their "
                "credentials."),
    "grants": ("corral.cli.grants", "grants",
               "Standing approvals: let one requester's Intents run without asking each time, in bounds."),
    "intents": ("corral.cli.intents", "intents",
                "List Intents waiting for approval (with --all: every Intent); `create` makes one."),
    "lease": ("corral.cli.lease", "lease",
              "Exclusive control of a Device: while you hold its lease, nobody else's Intents act on it."),
    "mcp": ("corral.cli.mcp", "mcp",
            "Run the MCP gateway: tools from device status, shown only as far as the caller's RBAC allows."),
    "people": ("corral.cli.people", "people", "People who approve: identities for the approval page."),
    "readings": ("corral.cli.readings", "readings",
                 "Print DEVICE's samples: the device's ts (cite it as --based-on METRIC@TS), the value and its age."),
    "rules": ("corral.cli.rules", "rules",
              "Rules that act without an agent: read them, accept an agent's revision, restore the previous one, "
              "pause."),
    "run": ("corral.cli.run", "run",
            "Run the controller: drive enrolled devices to their targets, mirror their contracts, decide Intents."),
    "secrets": ("corral.cli.secrets", "secrets", "Secrets Corral makes for itself (keys, certificates, passwords)."),
    "sim": ("corral.cli.sim", "sim",
            "Run simulated devices: each its own firmware instance with its own MQTT connection."),
    "tools": ("corral.cli.mcp", "tools",
              "Print the MCP tools a caller would see for one device (the CLI mirror of tools/list)."),
}

EXIT_CODES = """\b
Exit status (corral intents create, approve, deny, lease acquire|release|break):
  0  done: EXECUTED; your approval or denial taken
  1  an error before any outcome (kubeconfig, the API server refused)
  2  a usage error (a bad option or argument)
  3  refused: a DENY_* code, DENIED_BY_APPROVER, RATE_LIMITED, CANCELLED; or your Approval does not count
     (your own request, no approve verb, not a person: the message says why)
  4  allowed but not done: FAILED, TIMEOUT, DEVICE_GONE
  5  not decided yet: AWAITING_APPROVAL, or no outcome (no verdict on your Approval) when --wait ran out
  (a dry run: 0 it would execute or wait for a person, 3 it would be refused)"""


class _Commands(dict[str, click.Command]):
    """The group's commands, each imported the first time it is looked up (`cli.commands["run"]` too)."""

    def __missing__(self, name: str) -> click.Command:
        if name not in COMMANDS:
            raise KeyError(name)
        module, attribute, _ = COMMANDS[name]
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        self[name] = command
        return command


class LazyGroup(click.Group):
    """A group whose commands are imported when they are looked up, and listed from COMMANDS without importing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands(self.commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self.commands[cmd_name] if cmd_name in COMMANDS or cmd_name in self.commands else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx) if name in COMMANDS]
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, _shortened(text, limit)) for name, text in rows])


def _shortened(text: str, limit: int) -> str:
    """As click shortens a command's help in a listing: cut at a word, with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[:limit - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """Corral: let AI agents operate physical devices safely."""


def main() -> None:
    cli(prog_name="corral")


if __name__ == "__main__":  # pragma: no cover
    main()
