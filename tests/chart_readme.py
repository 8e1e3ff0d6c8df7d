"""charts/corral/README.md read back: its RBAC tables as rules, so tests keep them equal to what the chart grants
(a right added to the code and not to the README, or the other way round, fails a test); its k3s install as the
commands a test runs; what it says `helm uninstall` leaves, for a test to compare with the cluster."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

CHART_README = Path(__file__).resolve().parents[1] / "charts" / "corral" / "README.md"

Right = tuple[str, str, str]  # API group, resource, verb


def _rows(heading: str) -> list[list[str]]:
    section = CHART_README.read_text().split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows[1:]]  # after the header


def _verbs(text: str) -> set[str]:
    text = re.sub(r"\(.*?\)", "", text)
    return {verb.strip().strip("`") for verb in text.split(",") if verb.strip()}


def controller_rights() -> dict[tuple[str, str, bool], set[str]]:
    """(group, resource, limited to resourceNames) -> verbs, from "The controller" table. A row with empty
    group and resource cells goes on with the row above."""
    rights: dict[tuple[str, str, bool], set[str]] = {}
    group = resource = ""
    for cells in _rows("### The controller (`<fullname>-controller`)"):
        group = cells[0].strip("`") or group  # `""`: the core group
        resource = cells[1] or resource
        name = re.findall(r"`([a-z/]+)`", resource)[0]
        rights.setdefault((group, name, "resourceNames" in resource), set()).update(_verbs(cells[2]))
    return rights


def user_role_rights() -> dict[str, set[Right]]:
    """ClusterRole suffix (agent-reader, ...) -> rights, from the "People and agents" table, whose rules read
    `RESOURCES: VERBS; ...`, a resource of another group than corral.dev preceded by its group."""
    roles: dict[str, set[Right]] = {}
    for cells in _rows("### People and agents"):
        role = cells[0].strip("`").removeprefix("<fullname>-")
        rights = roles.setdefault(role, set())
        for part in cells[1].split(";"):
            resources, _, verbs = part.partition(":")
            for resource in resources.split(","):
                words = resource.replace("`", "").split()
                group, name = (words[0], words[1]) if len(words) == 2 else ("corral.dev", words[0])
                rights |= {(group, name, verb) for verb in _verbs(verbs)}
    return roles


K3S_HEADING = "## Install on k3s"
NODE_VARIABLE = "NODE"  # the block's first line sets it: the node's address on the LAN


def _section(heading: str) -> str:
    text = CHART_README.read_text()
    if f"\n{heading}\n" not in text:
        raise AssertionError(f"{CHART_README} has no heading {heading!r}")
    return text.split(f"\n{heading}\n", 1)[1]


def _first_sh_block(section: str) -> list[str]:
    match = re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    if match is None:
        raise AssertionError(f"no ```sh block in {CHART_README} under its heading")
    return match.group(1).splitlines()


def _commands(lines: list[str]) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    commands: list[str] = []
    pending = ""
    for line in lines:
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        command = _without_comment(pending).strip()
        pending = ""
        if command:
            commands.append(command)
    return commands


def _without_comment(line: str) -> str:
    """The line before a `#` that starts a comment (one outside quotes, after a blank or at the start)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def k3s_install_commands(node_address: str | None = None, helm_sets: Sequence[str] = ()) -> list[str]:
    """The commands of the chart README's k3s install (the ```sh block under "## Install on k3s"), in order, as a
    shell runs them one after the other (`NODE=...` first, a device simulator started with `&`).

    node_address: put into the block's `NODE=...` line instead of its example address. helm_sets: KEY=VALUE
    options appended to the `helm install` command as `--set KEY=VALUE` (e.g. the images you built yourself, as
    the README says: image.repository, image.tag, image.pullPolicy, mosquitto.image.*)."""
    commands = _commands(_first_sh_block(_section(K3S_HEADING)))
    if not commands or not commands[0].startswith(f"{NODE_VARIABLE}="):
        raise AssertionError(f"the k3s install block must begin by setting {NODE_VARIABLE}=, not {commands[:1]}")
    if node_address is not None:
        commands[0] = f"{NODE_VARIABLE}={shlex.quote(node_address)}"
    installs = [i for i, command in enumerate(commands) if command.startswith("helm install ")]
    if len(installs) != 1:
        raise AssertionError(f"the k3s install block must hold one helm install, not {len(installs)}")
    commands[installs[0]] += "".join(f" --set {shlex.quote(value)}" for value in helm_sets)
    return commands


def uninstall_leaves(fullname: str = "corral") -> set[tuple[str, str]]:
    """(kind, name) of what the README's "What `helm uninstall` leaves" table says stays, `<fullname>` filled in
    (names of the release namespace, but the Namespace and the CRDs)."""
    left: set[tuple[str, str]] = set()
    for kind, names, _why in _rows("### What `helm uninstall` leaves"):
        for name in re.findall(r"`([^`]+)`", names.split("(")[0]):
            left.add((kind, name.replace("<fullname>", fullname)))
    return left
