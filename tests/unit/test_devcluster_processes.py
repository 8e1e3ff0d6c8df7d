"""Process identity: `corral dev down` may only signal what `corral dev up` started."""

from __future__ import annotations

import socket
import subprocess
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
