"""`corral dev up/status/down` as a user runs them, in a scratch directory of their own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corral.devcluster.files import DEV_USER_CONTEXT
from corral.devcluster.plane import DevPlane

pytestmark = pytest.mark.integration

CORRAL = str(Path(sys.executable).parent / "corral")


def corral(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CORRAL, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions text (zombies have an empty command line)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_up_is_idempotent_and_down_stops_everything_it_started(tmp_path: Path) -> None:
    first = corral(tmp_path, "dev", "up")
    assert first.returncode == 0, first.stderr
    match = re.search(r"^kubeconfig: (\S+)$", first.stdout, re.MULTILINE)
    assert match, first.stdout
    kubeconfig = Path(match.group(1))
    assert kubeconfig == tmp_path / ".corral" / "dev" / "kubeconfig"

    env = (tmp_path / ".corral" / "dev" / "env").read_text()
    kubectl_dir = re.search(r"^export PATH=(\S+):", env, re.MULTILINE).group(1)
    kubectl = [str(Path(kubectl_dir) / "kubectl"), f"--kubeconfig={kubeconfig}"]

    readyz = subprocess.run([*kubectl, "get", "--raw", "/readyz"], capture_output=True, text=True, timeout=60)
    assert readyz.stdout == "ok"
    admin = subprocess.run([*kubectl, "auth", "can-i", "create", "pods"], capture_output=True, text=True)
    assert (admin.returncode, admin.stdout.strip()) == (0, "yes")
    user = subprocess.run(
        [*kubectl, f"--context={DEV_USER_CONTEXT}", "auth", "can-i", "create", "pods"], capture_output=True, text=True
    )
    assert (user.returncode, user.stdout.strip()) == (1, "no")

    second = corral(tmp_path, "dev", "up")
    assert second.returncode == 0, second.stderr
    assert "already running" in second.stderr
    assert second.stdout == first.stdout  # same server, broker and kubeconfig

    status = corral(tmp_path, "dev", "status")
    assert status.returncode == 0 and "/readyz ok" in status.stdout

    state_dir = str(tmp_path / ".corral" / "dev")
    assert len(processes_mentioning(state_dir)) == 2
    down = corral(tmp_path, "dev", "down")
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(state_dir) == []
    assert corral(tmp_path, "dev", "status").returncode == 1
    corral(tmp_path, "dev", "down", "--purge")


def test_down_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    """A recorded pid that now runs another program (pid reuse) is left alone."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / ".corral" / "dev"
        state.mkdir(parents=True)
        record = {"pid": bystander.pid, "argv": ["/cache/corral-kube", "serve", f"--state-dir={state}/kube"]}
        (state / "plane.json").write_text(json.dumps({"kube-apiserver": {"port": 1, "process": record}}))

        down = corral(tmp_path, "dev", "down")
        assert down.returncode == 0
        assert f"pid {bystander.pid} is gone or belongs to another program" in down.stdout
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_plane_started_with_another_configuration_is_not_reused_but_restarted(tmp_path: Path) -> None:
    """As if an older checkout had started it: `running()` refuses it (a test must not pass against it) and
    `corral dev up` says so and restarts what changed; a plane `up` started itself is reused as before."""
    first = corral(tmp_path, "dev", "up")
    assert first.returncode == 0, first.stderr
    state_dir = tmp_path / ".corral" / "dev"
    try:
        state_file = state_dir / "plane.json"
        state = json.loads(state_file.read_text())
        old_broker = state["mosquitto"]["process"]["pid"]
        old_api = state["kube-apiserver"]["process"]["pid"]
        state["mosquitto"]["config"] = "0" * 64  # the broker was started with other settings
        state_file.write_text(json.dumps(state))
        said: list[str] = []
        assert DevPlane(state_dir, progress=said.append).running() is None
        assert any("mosquitto with another configuration" in line for line in said), said

        again = corral(tmp_path, "dev", "up")
        assert again.returncode == 0, again.stderr
        assert "mosquitto: running" in again.stderr and "another configuration" in again.stderr
        assert "kube-apiserver: already running" in again.stderr
        state = json.loads(state_file.read_text())
        assert state["mosquitto"]["process"]["pid"] != old_broker and old_broker not in processes_mentioning(
            str(state_dir))
        assert state["kube-apiserver"]["process"]["pid"] == old_api
        assert DevPlane(state_dir).running() is not None
    finally:
        corral(tmp_path, "dev", "down", "--purge")
