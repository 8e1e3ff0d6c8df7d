"""Facts about this machine that the node takes as k3s takes them: its name, its address, whether we may run it.

Kept apart from node.py so the plane (plane.py) can start its API server for a node without importing the
node's orchestration, which imports the plane.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from corral.devcluster.errors import DevClusterError

# Where the one node of this machine says which state directory runs it. /run is emptied by a reboot, as the
# node's processes, mounts and rules are.
MACHINE_CLAIM = Path("/run/corral-node.json")
_CLAIM_LOCK = Path("/run/corral-node.lock")


def require_root() -> None:
    if os.geteuid() != 0:
        raise DevClusterError(
            "a node (`corral dev up --node`) needs root: the kubelet, containerd, the CNI bridge and kube-proxy's "
            f"iptables rules change this machine (running as uid {os.geteuid()}). Run it as root, or use "
            "`corral dev up` without --node (an API server and broker only, no Pods)")


def node_name() -> str:
    """The node's name: the host name in lower case, as k3s names its node."""
    name = socket.gethostname().split(".")[0].lower()
    if not name:
        raise DevClusterError("this machine has no host name; a node needs one (set it with `hostname NAME`)")
    return name


def node_ip() -> str:
    """The address of the interface holding the default route, as k3s picks --node-ip.

    A UDP socket "connected" to an outside address sends nothing but makes the kernel choose the source address
    of the default route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # TEST-NET-2: routed by the default route, never answered
            address = str(probe.getsockname()[0])
        except OSError as err:
            raise DevClusterError(f"this machine has no IPv4 default route, so the node has no address for Pods "
                                  f"to reach the API server ({err}); add a default route") from None
    if address.startswith("127.") or address == "0.0.0.0":
        raise DevClusterError(f"the default route's address is {address}; a node needs an address Pods can reach")
    return address


def claim_machine(state_dir: Path, still_running: Callable[[Path], list[str]]) -> Path | None:
    """Make this state directory's node the machine's one, or raise naming the node that is.

    `still_running(other_state_dir)` names the other node's live components. The claim also counts as live
    while the process that made it runs (it may still be building images, nothing started yet). Check and
    claim happen under one lock: two `up`s started together must not both win. Returns the state directory of
    a node that ended without `down` (its leftovers are the caller's to remove), else None.
    """
    with _locked():
        claim = _read_claim()
        if claim is None or Path(str(claim.get("state_dir"))) == state_dir:
            _write_claim(state_dir)
            return None
        other = Path(str(claim.get("state_dir")))
        running = still_running(other)
        claimant = claim.get("pid")
        if isinstance(claimant, int) and _started_at(claimant) == claim.get("started"):
            running.append(f"pid {claimant}, which claimed the machine for it, still running")
        if running:
            raise DevClusterError(
                f"a node already runs on this machine, from the plane in {other} ({', '.join(running)}); only one "
                f"node per machine (its kubelet, cni0 bridge and iptables rules are machine-wide). Stop it first: "
                f"corral dev down --state-dir {other}")
        _write_claim(state_dir)
        return other


def _write_claim(state_dir: Path) -> None:
    pid = os.getpid()
    MACHINE_CLAIM.write_text(json.dumps({"state_dir": str(state_dir), "pid": pid, "started": _started_at(pid)}) + "\n")


def _read_claim() -> dict | None:
    try:
        data = json.loads(MACHINE_CLAIM.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _started_at(pid: int) -> str | None:
    """A process' start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, an identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(_CLAIM_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def release_claim(state_dir: Path) -> None:
    claim = _read_claim()
    if claim is not None and claim.get("state_dir") == str(state_dir):
        MACHINE_CLAIM.unlink(missing_ok=True)
