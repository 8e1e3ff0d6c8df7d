"""Facts about this machine that the node takes as k3s takes them: its name, its address, whether we may run it.

Kept apart from node.py so the plane (plane.py) can start its API server for a node without importing the
node's orchestration, which imports the plane.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from corral.devcluster.errors import DevClusterError

# Where the one node of this machine says which state directory runs it. /run is emptied by a reboot, as the
# node's processes, mounts and rules are.
MACHINE_CLAIM = Path("/run/corral-node.json")


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


def claimed_by() -> dict | None:
    """The machine's node claim: {"state_dir": ..., "kubelet_pid": ...} or None."""
    try:
        data = json.loads(MACHINE_CLAIM.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_claim(state_dir: Path) -> None:
    MACHINE_CLAIM.write_text(json.dumps({"state_dir": str(state_dir)}) + "\n")


def release_claim(state_dir: Path) -> None:
    claim = claimed_by()
    if claim is not None and claim.get("state_dir") == str(state_dir):
        MACHINE_CLAIM.unlink(missing_ok=True)
