"""The README's steps, run in the order written against the demo, as a newcomer pastes them into a shell.

The blocks come from README.md itself; what the test changes in them (ports, the placeholders TS and NAME,
background commands) is the short list of rules in tests/readme_harness.py. Not run: `./scripts/up` and
`./scripts/test` (the demo is what `./scripts/up` runs), the k3s block, the MCP client's JSON, and the
plane-and-controller block of the step by step (the demo started those). One test per section, in the README's
order: a later section relies on what an earlier one did, as the reader's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral.devcluster.plane import DevPlane, Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import CORRAL
from tests.harness import kubectl, wait_for
from tests.integration.test_demo import _until_ready, demo_process
from tests.readme_harness import CHECKOUT_PARTS, README, REPO, Block, Ports, blocks, runnable, script

pytestmark = pytest.mark.integration


@dataclass
class Reader:
    """A reader's machine: a directory laid out like the checkout, the demo running in it, what each block
    printed, and the process groups of the blocks (their background commands live on in them)."""

    checkout: Path
    plane: Plane
    ports: Ports
    printed: dict[str, str] = field(default_factory=dict)  # section -> what its blocks printed on stdout
    groups: list[int] = field(default_factory=list)

    def run(self, section: str) -> str:
        """Every block of the section, in order; the first that fails, fails the test with its output. Returns
        what they printed on stdout (stderr has bash's trace of each command, for failures)."""
        out = []
        all_blocks = runnable(blocks(README.read_text()))
        chosen: list[Block] = [b for b in all_blocks if b.section.startswith(section)]
        assert chosen, f"README.md has no shell block in a section {section!r}"
        for block in chosen:
            index = all_blocks.index(block)
            proc = subprocess.Popen(["bash", "-c", script(block, self.ports, self.checkout / "logs", index)],
                                    cwd=self.checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True, env=_reader_environment(self.checkout / "home"))
            self.groups.append(proc.pid)
            try:
                text, trace = proc.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                text, trace = proc.communicate()
            out.append(text)
            assert proc.returncode == 0, (f"README.md line {block.line} ({block.section}) failed with exit "
                                          f"{proc.returncode}:\n{block.text}\n--- stdout:\n{text[-4000:]}\n"
                                          f"--- stderr:\n{trace[-5000:]}")
        self.printed[section] = "".join(out)
        return self.printed[section]

    def intent(self, name: str) -> dict:
        return json.loads(kubectl(self.plane, "get", "intent", name, "-n", "home", "-o", "json").stdout)

    def stop(self) -> None:
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)


def _reader_environment(home: Path) -> dict[str, str]:
    # A login shell's: paths and the locale, none of the test's own variables (no KUBECONFIG, no token), and a
    # home of its own (kubectl's cache and the Inspector's storage stay out of the real one).
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), **{key: value for key, value in os.environ.items()
                                  if key in ("PATH", "LANG", "LC_ALL", "TMPDIR")}}


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    checkout = tmp_path_factory.mktemp("readme") / "corral"
    (checkout / "logs").mkdir(parents=True)
    for part in CHECKOUT_PARTS:
        (checkout / part).symlink_to(REPO / part)
    state, port = checkout / ".corral" / "dev", free_port()
    with demo_process([CORRAL, "demo", "--state-dir", str(state), "--port", str(port)], state) as demo:
        lines = _until_ready(demo)
        audit = re.search(r"--server https://127\.0\.0\.1:(\d+)", (state / "demo-logs" / "demo.log").read_text())
        assert audit is not None, f"the demo did not say where its reader listens: {''.join(lines)[-2000:]}"
        plane = DevPlane(state).running()
        assert plane is not None
        reader = Reader(checkout, plane, Ports(port, int(audit.group(1)), free_port(), free_port()))
        try:
            yield reader
        finally:
            reader.stop()


def test_step_by_step_a_device_of_ones_own_a_patch_handed_back_and_an_approved_lock(reader: Reader) -> None:
    printed = reader.run("Step by step")
    # The person's patch reached the light, then the field went back to Intents: the agent-side request ran
    # instead of ending FAILED with a conflict.
    outcomes = re.compile(r"\b(cli-[\w-]+): ([A-Z_]+)(.*)$", re.MULTILINE)  # what `corral intents create` prints
    created = [(name, code) for name, code, _ in outcomes.findall(printed)]
    assert created and created[-1][1] == "EXECUTED", printed[-3000:]
    assert "conflict" not in reader.intent(created[-1][0])["status"].get("message", "")
    light = json.loads(kubectl(reader.plane, "get", "device", "porch-light", "-n", "home", "-o", "json").stdout)
    assert light["status"]["online"] is True
    # What handing the field back avoids (the README says so): with the person's value in place again, an Intent
    # on the field ends FAILED naming them, and the person's value stays.
    kubectl(reader.plane, "patch", "device", "porch-light", "-n", "home", "--type", "merge", "-p",
            '{"spec":{"target":{"power":true}}}')
    intent = {"apiVersion": "corral.dev/v1alpha1", "kind": "Intent", "metadata": {"name": "readme-conflict"},
              "spec": {"device": "porch-light", "actuator": "power", "action": "set_state", "params": {"value": False},
                       "reason": "the field is the person's", "requester": "corral-admin"}}
    subprocess.run([str(reader.plane.kubectl), f"--kubeconfig={reader.plane.kubeconfig}", "apply", "-n", "home", "-f",
                    "-"], input=json.dumps(intent), capture_output=True, text=True, check=True, timeout=60)
    ended = wait_for(lambda: (reader.intent("readme-conflict").get("status") or {}).get("code"),
                     "the Intent on the person's field decided", timeout_s=30)
    message = reader.intent("readme-conflict")["status"].get("message", "")
    assert ended == "FAILED" and "kubectl-patch" in message, message
    # and it says how to hand the field back, as the README does.
    assert """-p '{"spec":{"target":{"power":null}}}'""" in message, message
    # The lock the person asked for, approved by someone else, ran.
    wait_for(lambda: (reader.intent("lock-up-0001").get("status") or {}).get("code") == "EXECUTED",
             "lock-up-0001 EXECUTED after corral-dev-user approved it", timeout_s=30)
    # And the Device tells that story itself (`kubectl describe` ignores Events that only name it as related).
    def described() -> str:
        out = kubectl(reader.plane, "describe", "device", "front-door-lock", "-n", "home").stdout
        return out if "lock-up-0001" in out.partition("\nEvents:")[2] else ""

    shown = wait_for(described, "kubectl describe device front-door-lock shows the lock's Event", timeout_s=30)
    assert "Events:  <none>" not in shown


def test_connect_an_agent_with_its_own_binding_and_the_inspector(reader: Reader) -> None:
    printed = reader.run("Connect an agent")
    # The agent's own RoleBinding is what lets it control the light (without one it sees no tool to act with).
    assert re.search(r"^iot\.control\s", printed, re.MULTILINE), printed[-3000:]
    listed = [json.loads(chunk) for chunk in re.findall(r"^\{.*?^\}", printed, re.MULTILINE | re.DOTALL)]
    tools = {t["name"] for answer in listed for t in answer.get("tools", [])}
    assert {"iot.list_devices", "iot.control"} <= tools, printed[-3000:]
    assert "front-door-lock" in printed  # iot.list_devices answered with the demo's home


def test_approving_from_a_phone_the_console_answers_and_grants_come_and_go(reader: Reader) -> None:
    printed = reader.run("Approving from a phone")
    with urllib.request.urlopen(f"http://127.0.0.1:{reader.ports.console}/", timeout=30) as page:
        assert page.status == 200 and "<html" in page.read().decode().lower()
    assert re.search(r"^ey[\w-]+\.[\w-]+\.[\w-]+$", printed, re.MULTILINE), "people add printed no token"
    # The grant the README makes is listed, and NAME (the newest grant) revoked that one: it is gone.
    made = re.search(r"^(grant-[\w-]+): .*front-door-lock.* without asking$", printed, re.MULTILINE)
    assert made is not None and f"{made[1]}: revoked" in printed, printed[-2000:]
    grants = json.loads(kubectl(reader.plane, "get", "approvalgrants", "-n", "home", "-o", "json").stdout)["items"]
    assert made[1] not in [g["metadata"]["name"] for g in grants]


def test_readings_a_cited_sample_runs_and_a_dry_run_only_checks(reader: Reader) -> None:
    printed = reader.run("Readings, evidence")
    # `kubectl get --raw` ends without a newline: the next command's output goes on on its line.
    outcomes = re.findall(r"\b(cli-[\w-]+): ([A-Z_]+)(.*)$", printed, re.MULTILINE)
    assert len(outcomes) == 2, printed[-3000:]
    assert [code for _, code, _ in outcomes[:1]] == ["EXECUTED"], printed[-3000:]
    assert "(dry run)" in outcomes[-1][2], printed[-3000:]
    assert reader.intent(outcomes[-1][0])["status"]["phase"] == "DryRun"


def test_the_audit_log_verifies(reader: Reader) -> None:
    printed = reader.run("The audit log")
    assert (reader.checkout / "controller.pem").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert re.search(r"^OK: \d+ records", printed, re.MULTILINE), printed[-3000:]
