"""The RBAC tables of charts/corral/README.md, read back as rules, so tests keep them equal to what the chart
grants: a right added to the code and not to the README (or the other way round) fails a test."""

from __future__ import annotations

import re
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
