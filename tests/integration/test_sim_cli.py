"""`corral sim` as a person runs it: a process that puts devices on the broker and takes them off cleanly."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from corral.contract.model import Contract
from corral.devcluster.files import BROKER_CONTROLLER
from corral.devcluster.plane import Plane
from corral.devices.credentials import write_credentials
from corral_sim.presets import HOME
from tests.broker_harness import device_accounts
from tests.fleet_harness import Watcher, retained

pytestmark = pytest.mark.integration

CORRAL = [sys.executable, "-m", "corral.cli.main"]


def start_sim(plane: Plane, prefix: str, ids: set[str], credentials: Path, *args: str) -> subprocess.Popen[str]:
    """`corral sim` with the devices' own accounts, as `corral devices enroll --write` leaves them (the
    controller would make the broker accounts; no controller runs here, so the test makes them)."""
    passwords = {device_id: secrets.token_urlsafe(16) for device_id in ids}
    device_accounts(plane, prefix, passwords)
    write_credentials(credentials, passwords)
    # The env of `corral dev up` names the controller's account and its password file: the sim must not use it.
    env = {**os.environ, "CORRAL_MQTT_URL": f"mqtt://{BROKER_CONTROLLER}@127.0.0.1:{plane.mqtt_port}",
           "CORRAL_MQTT_PASSWORD_FILE": str(plane.password_file(BROKER_CONTROLLER))}
    return subprocess.Popen(
        [*CORRAL, "sim", "--prefix", prefix, "--credentials", str(credentials), *args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )


def test_sim_runs_devices_until_sigterm_then_leaves_each_retained_offline(plane: Plane, tmp_path: Path) -> None:
    prefix = f"cli-{uuid.uuid4().hex[:8]}"
    watcher = Watcher(plane, prefix)
    ids = ["relay-1", "relay-2", "lock-1"]
    sim = start_sim(plane, prefix, set(ids), tmp_path / "creds.json", "--device", "relay:2", "--device", "lock",
                    "--telemetry-interval", "0.5")
    try:
        for device_id in ids:
            watcher.wait_status(device_id, "online", timeout_s=15)
        watcher.wait_count("relay-1", "telemetry", 2)
        sim.send_signal(signal.SIGTERM)
        _, stderr = sim.communicate(timeout=15)
        assert sim.returncode == 0, stderr
        assert "3 devices on mqtt://127.0.0.1" in stderr and "each device with its own account" in stderr
        assert "stopped; 3 of 3 devices published retained offline" in stderr
        for device_id in ids:
            watcher.wait_status(device_id, "offline")
            assert retained(plane, f"{prefix}/{device_id}/status").payload == b"offline"
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.communicate()
        watcher.close()


def test_the_home_preset_starts_a_household_of_valid_devices(plane: Plane, tmp_path: Path) -> None:
    prefix = f"home-{uuid.uuid4().hex[:8]}"
    watcher = Watcher(plane, prefix)
    ids = {device_id for _, device_id, _ in HOME}
    sim = start_sim(plane, prefix, ids, tmp_path / "creds.json", "--preset", "home", "--duration", "60")
    try:
        watcher.wait_for(
            f"{len(ids)} devices online",
            lambda: {m.device_id for m in watcher.messages(kind="status") if m.payload == b"online"} == ids,
            timeout_s=20,
        )
        infos = {m.device_id: m for m in watcher.messages(kind="info")}
        assert set(infos) == ids
        for device_id, message in infos.items():
            assert Contract.model_validate_json(message.payload).device_id == device_id
        sim.send_signal(signal.SIGINT)
        _, stderr = sim.communicate(timeout=15)
        assert sim.returncode == 0, stderr
        assert f"stopped; {len(ids)} of {len(ids)} devices published retained offline" in stderr
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.communicate()
        watcher.close()
