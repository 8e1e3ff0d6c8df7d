"""The image recipe, checked statically with BuildKit's own Dockerfile parser (no Docker engine here)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import dockerfile

REPO = Path(__file__).resolve().parents[2]
COMMANDS = dockerfile.parse_file(str(REPO / "Dockerfile"))
STAGES: list[list[dockerfile.Command]] = []
for command in COMMANDS:
    if command.cmd == "FROM":
        STAGES.append([])
    if STAGES:
        STAGES[-1].append(command)
FINAL = STAGES[-1]
BUILD_TOOLS = re.compile(r"\b(apt-get|apt|apk|gcc|g\+\+|make|build-essential|pip|git|curl|wget)\b")


def _args() -> dict[str, str]:
    return dict(c.value[0].split("=", 1) for c in COMMANDS if c.cmd == "ARG" and "=" in c.value[0])


def test_it_is_a_multi_stage_build_on_a_slim_python() -> None:
    assert len(STAGES) >= 2
    base = FINAL[0].value[0].replace("${PYTHON_IMAGE}", _args().get("PYTHON_IMAGE", ""))
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), base


def test_the_final_stage_has_no_build_tools_and_copies_only_the_virtualenv() -> None:
    runs = [c.original for c in FINAL if c.cmd == "RUN"]
    assert not any(BUILD_TOOLS.search(r) for r in runs), runs
    copies = [c for c in FINAL if c.cmd in ("COPY", "ADD")]
    assert [(c.cmd, c.flags, c.value) for c in copies] == [("COPY", ("--from=build",), ("/opt/corral", "/opt/corral"))]


def test_it_runs_as_a_numeric_non_root_user_with_corral_as_entrypoint() -> None:
    users = [c for c in FINAL if c.cmd == "USER"]
    assert users, "the final stage must set USER"
    uid, _, gid = users[-1].value[0].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0)
    last_user_line = users[-1].start_line
    assert all(c.start_line < last_user_line for c in FINAL if c.cmd in ("RUN", "COPY", "ADD"))
    entrypoint = [c for c in FINAL if c.cmd == "ENTRYPOINT"][-1]
    assert entrypoint.json and entrypoint.value == ("corral",), "exec form, so signals reach corral"


def test_it_carries_oci_labels_with_the_package_version_and_license() -> None:
    labels: dict[str, str] = {}
    for command in FINAL:
        if command.cmd == "LABEL":
            pairs = command.value
            labels |= {pairs[i]: pairs[i + 1].strip('"') for i in range(0, len(pairs), 2)}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for key in ("title", "description", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{key}" in labels
    version_arg = [c for c in FINAL if c.cmd == "ARG" and c.value[0].startswith("CORRAL_VERSION=")]
    assert version_arg and version_arg[0].value[0] == f"CORRAL_VERSION={project['version']}"
    assert labels["org.opencontainers.image.licenses"] == project["license"]


def test_the_build_context_holds_what_the_build_copies_and_nothing_else() -> None:
    patterns = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]

    def sent(path: str) -> bool:  # Docker's rule: the last matching pattern wins
        included = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            core = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, core) or path.startswith(core + "/"):
                included = negate
        return included

    for command in COMMANDS:
        if command.cmd == "COPY" and not command.flags:
            for source in command.value[:-1]:
                assert (REPO / source).exists(), f"{source} is copied but does not exist"
                assert sent(source), f"{source} is copied but .dockerignore leaves it out"
    for private in (".venv", ".corral", ".git", "tests", "firmware/node_modules", "tools/kube"):
        assert not sent(private), f"{private} must stay out of the build context"
