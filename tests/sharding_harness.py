"""A big fleet fast: devices enrolled a few at a time, and a broker that starts with all their accounts.

Made through the dynamic security plugin, accounts cost more the more there are (the plugin rewrites its whole
state file after each command): 300 in one message outlast a 30 s answer, 5,000 take about 700 s. So the broker
here is one of the test's own, configured as the plane's (devcluster/broker.py: TLS, ACLs, the controller
accounts corral-controller and -1..3), whose dynamic-security state is written with every device's account before
it starts. The accounts are what the controller itself makes (devices/accounts.py: a role per device, the
description marker that says the account matches the enrollment), so the leader finds nothing to change.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from corral.client.enroll import enroll
from corral.devcluster import broker, files
from corral.devcluster.plane import Plane, find_mosquitto
from corral.devcluster.processes import accepts_connections, free_port
from corral.devices.accounts import acls, marker, role_name
from corral.devices.topics import Topics
from corral.privatefile import write_private
from tests.harness import wait_for


def enroll_many(admin: Any, namespace: str, devices: dict[str, str]) -> dict[str, str]:
    """Enroll the devices (id -> type) as a person would (a Device and a Secret each), eight at a time:
    id -> password."""
    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(lambda item: (item[0], enroll(admin, namespace, item[0], item[1]).password),
                             devices.items()))


@dataclass(frozen=True)
class PrebuiltBroker:
    port: int
    directory: Path
    passwords: dict[str, str]  # the broker's own: controller (every controller account's), admin
    pid: int

    def plane(self, plane: Plane) -> Plane:
        """The plane with this broker in place of its own (for running_fleet, the gateway, observers)."""
        return replace(plane, mqtt_url=f"mqtt://127.0.0.1:{self.port}", broker_passwords=dict(self.passwords))

    def controller_url(self, username: str) -> str:
        """A controller account's URL with its password, as ControllerProcess(mqtt_url=...) takes it."""
        return f"mqtt://{quote(username)}:{quote(self.passwords['controller'])}@127.0.0.1:{self.port}"


@contextmanager
def broker_with_accounts(directory: Path, prefix: str, passwords: dict[str, str]) -> Iterator[PrebuiltBroker]:
    """A Mosquitto started with the accounts of these devices (id -> password) on this topic prefix."""
    own = broker.new_passwords()
    port = free_port()
    prepared = broker.prepare(directory, port, free_port(), own)
    state_file = directory / "dynamic-security.json"
    state = json.loads(state_file.read_text())
    topics = Topics(prefix)
    for device_id, password in passwords.items():
        state["roles"].append({"rolename": role_name(device_id), "acls": acls(topics, device_id)})
        state["clients"].append({"username": device_id, "textdescription": marker(topics, password),
                                 "roles": [{"rolename": role_name(device_id)}],
                                 **files.dynsec_password(password, secrets.token_bytes(12))})
    write_private(state_file, json.dumps(state).encode())
    proc = subprocess.Popen([find_mosquitto(), "-c", str(prepared.conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"mosquitto exited with {proc.returncode} (its state: {state_file})")
            return accepts_connections(port)

        wait_for(listening, f"a broker with {len(passwords)} device accounts on port {port}", timeout_s=60)
        yield PrebuiltBroker(port, directory, own, proc.pid)
    finally:
        proc.kill()
        proc.wait(5)
