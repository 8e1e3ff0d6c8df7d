"""The README's command blocks as tests/integration/test_readme.py runs them: read from README.md itself, so the
README cannot drift from what works, and changed only by the few rules below, each visible here.

Pure text (no I/O beyond reading the README), so tests/unit/test_readme_blocks.py checks the rules cover every
block without a cluster.

The rules, all of them:
- Sections run: SECTIONS, every ```sh / ```bash block in them, in the README's order, except SKIPPED (with why).
- Each block runs in a new `bash` with `set -eo pipefail` (any failing command fails the test), in a directory
  laid out like a checkout (`.venv`, `crds`, `examples`, `tools` are this checkout's, `.corral/dev` is the
  demo's state), after `source .corral/dev/env`: the reader's shell keeps what the first block sourced.
- Placeholders: `--based-on METRIC@TS` cites the newest sample of METRIC on the Intent's Device (what
  `corral readings` shows last); `grants revoke NAME` revokes the newest ApprovalGrant in `home`.
- Ports: 8000 (the demo's gateway) and 8443 (the demo's reader) become the ports the demo took; 8001 (a
  gateway of one's own) and 8080 (the console) become free ports.
- A command ending in `&` writes its output to a log, and the block waits until it is ready (READY: a port
  that accepts, the enrolled devices online) before the next command; the test stops it at the end.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"

SECTIONS = ("Step by step", "Connect an agent", "Approving from a phone",
            "Readings, evidence, interlocks and dry runs", "The audit log")

# Blocks not run (by their first line), and why.
SKIPPED = {
    ".venv/bin/corral dev up && source .corral/dev/env":
        "the plane, CRDs, namespace and controller without the demo: the demo started all of them",
}

# The checkout's parts a block may use, linked into the directory it runs in.
CHECKOUT_PARTS = (".venv", "crds", "examples", "tools")

_FENCE = re.compile(r"^```(\w*)\s*$")
_BACKGROUND = re.compile(r"^(?P<command>.*[^&\s])\s+&(?:\s+#.*)?$")  # `cmd &  # why`, not `a && b`
_BASED_ON = re.compile(r"intents create (?P<device>\S+) .*--based-on (?P<metric>[\w.-]+)@TS\b")
_PORT = re.compile(r"\b(8000|8001|8080|8443)\b")


@dataclass(frozen=True)
class Block:
    section: str
    line: int  # of its first command in README.md
    text: str

    @property
    def first(self) -> str:
        return self.text.splitlines()[0].strip()


@dataclass(frozen=True)
class Ports:
    gateway: int  # the demo's (README: 8000)
    reader: int  # the demo's audit log and readings server (README: 8443)
    own_gateway: int  # README: 8001
    console: int  # README: 8080

    def of(self, readme_port: str) -> int:
        return {"8000": self.gateway, "8443": self.reader, "8001": self.own_gateway, "8080": self.console}[readme_port]


def blocks(text: str) -> list[Block]:
    """Every shell block of SECTIONS, in order."""
    found: list[Block] = []
    section, fence, start = "", None, 0
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        opening = _FENCE.match(line)
        if fence is None and line.startswith("## "):
            section = line[3:].strip()
        elif fence is None and opening:
            fence, start, body = opening.group(1), number + 1, []
        elif fence is not None and line.strip() == "```":
            if fence in ("sh", "bash", "shell") and any(section.startswith(s) for s in SECTIONS):
                found.append(Block(section, start, "\n".join(body) + "\n"))
            fence = None
        elif fence is not None:
            body.append(line)
    return found


def runnable(all_blocks: list[Block]) -> list[Block]:
    return [b for b in all_blocks if not any(b.first.startswith(skipped) for skipped in SKIPPED)]


def ready_check(command: str, ports: Ports) -> str:
    """The shell check that a background command is ready; a command with no rule is an error here, so a new
    `&` in the README needs a rule before its test can pass."""
    words = shlex.split(command, comments=True)
    if "--port" in words and any(w in words for w in ("mcp", "console")):
        return f"__port {words[words.index('--port') + 1]}"
    if "sim" in words and "--credentials" in words:
        return f"__online {shlex.quote(words[words.index('--credentials') + 1])}"
    raise ValueError(f"no readiness rule for the background command {command!r} (tests/readme_harness.py)")


def script(block: Block, ports: Ports, logs: Path, index: int) -> str:
    """The block as bash runs it: ports and placeholders replaced, background commands logged and waited for."""
    lines: list[str] = []
    background = 0
    for line in _logical_lines(block.text):
        line = _PORT.sub(lambda m: str(ports.of(m.group(1))), line)
        cited = _BASED_ON.search(line)
        if cited:
            line = line.replace(f"{cited['metric']}@TS",
                                f"{cited['metric']}@$(__newest_ts {cited['device']} {cited['metric']})")
        line = re.sub(r"grants revoke NAME\b", 'grants revoke "$(__newest approvalgrants)"', line)
        started = _BACKGROUND.match(line)
        if started:
            background += 1
            log = logs / f"block{index}-background{background}.log"
            lines += [f"__bg_log={shlex.quote(str(log))}",
                      f"{started['command']} > \"$__bg_log\" 2>&1 &",
                      "__bg_pid=$!",
                      f"__wait 120 {ready_check(started['command'], ports)}"]
        else:
            lines.append(line)
    return PRELUDE + f"# README.md line {block.line} ({block.section})\n" + "\n".join(lines) + "\n"


def _logical_lines(text: str) -> list[str]:
    """Lines as bash reads them: one ending in a backslash goes on in the next (none of the README's is quoted)."""
    lines: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    return lines + ([pending] if pending else [])


# Sourced before every block. `__wait` polls (a condition, not a fixed sleep) and fails early, with the
# background command's log, when that command has exited.
PRELUDE = r"""set -eo pipefail
PS4='+ README: '
source .corral/dev/env
__bg_pid= __bg_log=/dev/null
__wait() {
  local limit=$1; shift
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$__bg_pid" ] && ! kill -0 "$__bg_pid" 2>/dev/null; then
      echo "README test: the background command exited before '$*'; its log:" >&2; cat "$__bg_log" >&2; return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "README test: not ready within ${limit}s: $*; its log:" >&2; tail -n 40 "$__bg_log" >&2; return 1
    fi
    sleep 0.2
  done
}
__port() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
__online() {
  local id
  for id in $(.venv/bin/python -c 'import json, sys; print(*json.load(open(sys.argv[1]))["devices"])' "$1"); do
    [ "$(kubectl get devices -n home -o jsonpath="{.items[?(@.spec.deviceId==\"$id\")].status.online}")" = true ] || return 1
  done
}
__newest_ts() {
  kubectl get --raw "/apis/readings.corral.dev/v1alpha1/namespaces/home/devices/$1" \
    | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["metrics"][sys.argv[1]]["samples"][-1]["ts"])' "$2"
}
__newest() { kubectl get "$1" -n home --sort-by=.metadata.creationTimestamp -o jsonpath='{.items[-1:].metadata.name}'; }
set -x
"""
