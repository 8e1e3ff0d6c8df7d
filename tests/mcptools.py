"""Run the MCP conformance suite and the MCP Inspector CLI from Python tests.

Both are npm packages pinned in tools/mcp-tools/package.json, with the Node 22 runtime they
need (from the npm registry's `node-linux-<arch>` packages), installed by scripts/bootstrap
with `npm ci`. Nothing here touches the system `node`.

- `run_conformance(url, out_dir)`: `@modelcontextprotocol/conformance server` against a
  Streamable HTTP endpoint; per-scenario results parsed from the checks.json files it writes.
- `inspector_cli([...])`: `@modelcontextprotocol/inspector --cli`, typically against a stdio
  server, returning the JSON result it prints.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
TOOLS_DIR = REPO / "tools" / "mcp-tools"
NODE_MODULES = TOOLS_DIR / "node_modules"
CONFORMANCE_JS = NODE_MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
INSPECTOR_JS = NODE_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
INJECT_HEADERS_MJS = TOOLS_DIR / "inject-headers.mjs"

_MIN_NODE_MAJOR = 22
_NODE_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
# conformance writes each scenario's results to <out>/server-<scenario>-<ISO time with : and . as ->
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")


class McpToolsError(RuntimeError):
    """A tool in tools/mcp-tools is missing, or ran and failed in a way a test cannot read."""


def _missing(what: str) -> McpToolsError:
    return McpToolsError(
        f"{what} is not installed under {NODE_MODULES}: run scripts/bootstrap (npm ci in tools/mcp-tools)"
    )


@cache
def node22() -> Path:
    """Path of the Node >= 22 binary installed in tools/mcp-tools/node_modules.

    Raises McpToolsError (telling to run scripts/bootstrap) if it is missing or too old.
    """
    arch = _NODE_ARCH.get(platform.machine().lower(), platform.machine().lower())
    candidates = [NODE_MODULES / f"node-linux-{arch}" / "bin" / "node", NODE_MODULES / ".bin" / "node"]
    binary = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if binary is None:
        raise _missing(f"Node {_MIN_NODE_MAJOR} (npm package node-linux-{arch})")
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major = int(version.lstrip("v").split(".")[0])
    if major < _MIN_NODE_MAJOR:
        raise McpToolsError(f"{binary} is Node {version}, need >= {_MIN_NODE_MAJOR}: run scripts/bootstrap")
    return binary


def _script(path: Path, package: str) -> Path:
    if not path.is_file():
        raise _missing(package)
    return path


# --- conformance ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One entry of a scenario's checks.json. status is SUCCESS, FAILURE, WARNING or INFO."""

    id: str
    name: str
    status: str
    description: str
    error_message: str | None
    raw: Mapping[str, Any]


@dataclass(frozen=True)
class ScenarioResult:
    """The checks of one conformance scenario, as written to its checks.json."""

    name: str
    checks: tuple[Check, ...]
    result_dir: Path

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "FAILURE"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "WARNING"]

    @property
    def passed(self) -> bool:
        """No FAILURE check: what the CLI's summary counts as passing (✓)."""
        return not self.failures

    @property
    def clean(self) -> bool:
        """No FAILURE and no WARNING check: what --expected-failures counts as passing."""
        return not self.failures and not self.warnings

    def explain(self) -> str:
        """One line per FAILURE/WARNING check, for assertion messages."""
        return "\n".join(
            f"{self.name}: {c.status} {c.id}: {c.error_message or c.description}"
            for c in self.checks
            if c.status in ("FAILURE", "WARNING")
        )


@dataclass(frozen=True)
class ConformanceResult:
    """A conformance run: per-scenario results plus the CLI's exit code and output.

    returncode is 0 when no scenario had a FAILURE check (or, with expected_failures, when the
    run matched the baseline exactly), 1 otherwise.
    """

    scenarios: Mapping[str, ScenarioResult]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def passed(self) -> list[str]:
        return [n for n, s in self.scenarios.items() if s.passed]

    @property
    def failed(self) -> list[str]:
        return [n for n, s in self.scenarios.items() if not s.passed]

    def against_baseline(self, expected_failures: Iterable[str]) -> tuple[list[str], list[str]]:
        """(unexpected failures, stale baseline entries), with the CLI's --expected-failures
        rules: a scenario fails if any check is FAILURE or WARNING; a baseline entry is stale
        if its scenario ran and was clean. Entries for scenarios that did not run are ignored."""
        expected = set(expected_failures)
        unexpected = [n for n, s in self.scenarios.items() if not s.clean and n not in expected]
        stale = [n for n, s in self.scenarios.items() if s.clean and n in expected]
        return unexpected, stale

    def explain(self) -> str:
        return "\n".join(s.explain() for s in self.scenarios.values() if not s.clean)


def _read_scenario(name: str, result_dir: Path) -> ScenarioResult:
    checks_file = result_dir / "checks.json"
    if not checks_file.is_file():
        # the CLI makes the directory first; a scenario that throws leaves it empty
        crashed = {
            "id": name,
            "name": name,
            "status": "FAILURE",
            "description": "scenario wrote no checks.json (it crashed; see stdout/stderr)",
        }
        entries: list[dict[str, Any]] = [crashed]
    else:
        entries = json.loads(checks_file.read_text())
    checks = tuple(
        Check(
            id=str(e.get("id", "")),
            name=str(e.get("name", "")),
            status=str(e.get("status", "")),
            description=str(e.get("description", "")),
            error_message=e.get("errorMessage"),
            raw=e,
        )
        for e in entries
    )
    return ScenarioResult(name=name, checks=checks, result_dir=result_dir)


def conformance_scenarios() -> list[str]:
    """Names of all server scenarios the installed conformance suite knows (`list --server`),
    including the pending ones that the default "active" suite skips."""
    out = subprocess.run(
        [str(node22()), str(_script(CONFORMANCE_JS, "@modelcontextprotocol/conformance")), "list", "--server"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [m.group(1) for m in re.finditer(r"^\s+- (\S+)", out, re.MULTILINE)]


def run_conformance(
    url: str,
    out_dir: Path,
    timeout: float = 180.0,
    *,
    scenario: str | None = None,
    suite: str = "active",
    spec_version: str | None = None,
    expected_failures: Path | None = None,
    headers: Mapping[str, str] | None = None,
) -> ConformanceResult:
    """Run the conformance suite in server mode against the Streamable HTTP endpoint `url`.

    Runs one `scenario`, or else a `suite`: "active" (the CLI's default: every server
    scenario but the pending ones), "all" or "pending". `spec_version` (e.g. "2025-06-18")
    keeps the scenarios of that spec version. `expected_failures` is passed on as the CLI's
    --expected-failures YAML baseline (`server: [scenario, ...]`), which then decides
    returncode; `ConformanceResult.against_baseline` does the same comparison in Python.

    `headers` (e.g. {"Authorization": "Bearer ..."}) are added to every HTTP request the suite
    sends to url's origin, through tools/mcp-tools/inject-headers.mjs: the CLI has no option
    for that. Each scenario opens its own session(s) and sends requests on its own; a failing
    scenario is a result, not an exception.

    out_dir receives one server-<scenario>-<time>/checks.json per scenario; it must be empty
    or absent, so that results of another run are not mixed in. Raises McpToolsError if the
    run times out or writes no results at all (bad URL, unknown scenario).
    """
    node = node22()
    script = _script(CONFORMANCE_JS, "@modelcontextprotocol/conformance")
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} is not empty")

    argv = [str(node)]
    env = dict(os.environ)
    if headers:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        env["CORRAL_MCP_EXTRA_HEADERS"] = json.dumps({"origin": origin, "headers": dict(headers)})
        argv += ["--import", _script(INJECT_HEADERS_MJS, "inject-headers.mjs").as_uri()]
    argv += [str(script), "server", "--url", url, "--output-dir", str(out_dir)]
    argv += ["--scenario", scenario] if scenario else ["--suite", suite]
    if spec_version:
        argv += ["--spec-version", spec_version]
    if expected_failures is not None:
        argv += ["--expected-failures", str(Path(expected_failures).resolve())]

    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            check=False,
            cwd=out_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as err:
        raise McpToolsError(
            f"conformance run against {url} timed out after {timeout}s; stdout:\n{err.stdout!r}"
        ) from err
    seconds = time.monotonic() - started

    scenarios: dict[str, ScenarioResult] = {}
    for child in sorted(out_dir.iterdir(), key=lambda p: p.name[-24:]):  # by the time in the name
        match = _RESULT_DIR.match(child.name)
        if child.is_dir() and match:
            scenarios[match["scenario"]] = _read_scenario(match["scenario"], child)
    if not scenarios:
        raise McpToolsError(f"conformance wrote no results (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return ConformanceResult(
        scenarios=scenarios, returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr, seconds=seconds
    )


# --- inspector ------------------------------------------------------------------------------


class InspectorError(McpToolsError):
    """The Inspector CLI exited non-zero. `error` is its JSON error envelope's "error" object
    (e.g. {"code": "tool_not_found", "message": ...}) when it printed one."""

    def __init__(self, returncode: int, error: Mapping[str, Any] | None, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.error = error
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(f"inspector --cli exited {returncode}: {error or stderr.strip()[-2000:]}")


_TOOL_ERROR_EXIT = 5  # the CLI's exit code when tools/call returned isError: true


def _last_json_object(text: str) -> Any:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def inspector_cli(args: list[str], timeout: float = 60.0, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run `inspector --cli --format json --quiet <args>` and return the result it prints
    (the "result" member of its JSON output: e.g. {"tools": [...]} for tools/list).

    args are the Inspector CLI's own: the server (a command and its arguments for stdio, or a
    URL) and the request, e.g.
        inspector_cli(["--method", "tools/list", "--", sys.executable, "server.py"])
        inspector_cli(["--method", "tools/call", "--tool-name", "echo", "--tool-arg", "text=hi",
                       "--", sys.executable, "server.py"])
    Put the server command after "--" when its own arguments start with "-". --tool-arg values
    are parsed as JSON when they parse (n=5 is a number), else kept as strings; use
    --tool-args-json '{...}' for exact arguments. For HTTP: "--server-url", url, "--transport",
    "http", "--header", "Authorization: Bearer ...".

    A tools/call whose result has isError: true returns that result (the CLI exits 5 then).
    Any other non-zero exit raises InspectorError carrying the CLI's JSON error envelope.

    A stdio server does not inherit this process's environment: it gets only a handful of
    variables (HOME, PATH, SHELL, TERM, USER, ...: the MCP SDK's default) plus `env`, which
    is passed as `-e K=V` (so set PYTHONPATH etc. there).
    """
    node = node22()
    script = _script(INSPECTOR_JS, "@modelcontextprotocol/inspector")
    env_args = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
    argv = [str(node), str(script), "--cli", "--format", "json", "--quiet", *env_args, *args]
    try:
        proc = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as err:
        raise McpToolsError(f"inspector --cli {args} timed out after {timeout}s") from err
    result: Any = None
    if proc.stdout.strip():  # --format json prints {"result": ...}
        try:
            result = json.loads(proc.stdout).get("result")
        except (json.JSONDecodeError, AttributeError):
            result = None
    if proc.returncode == 0 and isinstance(result, dict):
        return result
    if proc.returncode == _TOOL_ERROR_EXIT and isinstance(result, dict) and result.get("isError") is True:
        return result
    envelope = _last_json_object(proc.stderr)
    error = envelope.get("error") if isinstance(envelope, dict) else None
    raise InspectorError(proc.returncode, error if isinstance(error, dict) else None, proc.stdout, proc.stderr)
