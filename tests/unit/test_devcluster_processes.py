"""Process identity: `corral dev down` may only signal what `corral dev up` started."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.devcluster import processes
from corral.devcluster.processes import ProcessRecord, free_port, is_ours, stop


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_record_is_ours_only_while_the_same_command_runs(sleeper: subprocess.Popen[bytes]) -> None:
    assert is_ours(ProcessRecord(sleeper.pid, ["sleep", "30"]))
    assert not is_ours(ProcessRecord(sleeper.pid, ["sleep", "31"]))
    sleeper.kill()
    sleeper.wait()
    assert not is_ours(ProcessRecord(sleeper.pid, ["sleep", "30"]))


def test_stop_refuses_a_pid_that_runs_another_command(sleeper: subprocess.Popen[bytes]) -> None:
    assert stop(ProcessRecord(sleeper.pid, ["corral-kube", "serve"])) is False
    assert sleeper.poll() is None


def test_stop_terminates_our_process(sleeper: subprocess.Popen[bytes]) -> None:
    record = ProcessRecord(sleeper.pid, ["sleep", "30"])
    assert stop(record, grace_s=5) is True
    assert not is_ours(record)
    assert not Path(f"/proc/{sleeper.pid}").exists()  # exited and reaped


def test_record_round_trips_through_json_and_rejects_garbage() -> None:
    record = ProcessRecord(42, ["mosquitto", "-c", "x.conf"])
    assert ProcessRecord.from_json(record.to_json()) == record
    with pytest.raises(ValueError):
        ProcessRecord.from_json({"pid": "42", "argv": "mosquitto"})


def test_free_ports_are_never_ones_an_outgoing_connection_could_take_meanwhile() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50, "a port is handed out once"
    assert all(1024 <= port < low for port in ports), "below the ephemeral range"
    assert not any(port in processes.NODE_PORTS for port in ports), "outside the NodePort range a node's Services own"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not processes._bindable(taken)
    assert processes._bindable(ports[0])


def test_a_started_process_gets_the_runtime_settings_it_is_given_and_no_other_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The plane gives kube-apiserver GOGC (plane.APISERVER_ENV); an exported secret still stays behind.
    monkeypatch.setenv("GOGC", "off")
    monkeypatch.setenv("CORRAL_TEST_SECRET", "hunter2")
    log = tmp_path / "child.log"
    script = 'echo "GOGC=${GOGC:-unset} SECRET=${CORRAL_TEST_SECRET:-unset}"'
    record = processes.start_detached(["sh", "-c", script], log, env={"GOGC": "200"})
    try:
        deadline = time.monotonic() + 10
        while "SECRET=" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop(record, grace_s=1)
    assert log.read_text().strip() == "GOGC=200 SECRET=unset"
    plain = processes.start_detached(["sh", "-c", script], tmp_path / "plain.log")
    try:
        deadline = time.monotonic() + 10
        while "SECRET=" not in (tmp_path / "plain.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop(plain, grace_s=1)
    assert (tmp_path / "plain.log").read_text().strip() == "GOGC=unset SECRET=unset"
