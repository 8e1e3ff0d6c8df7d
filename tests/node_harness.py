"""The real node for tests: one `corral dev up --node` per test session, and small helpers to use it.

`node_plane` (a session fixture, conftest.py) starts a plane with a node in a temporary state directory, waits
for the node, CoreDNS and local-path to be Ready, and at the end removes it all, checking that no cni0 bridge
and no KUBE-/CNI- iptables chain is left. Not root: every test using it is skipped, saying why.

For tests on top of it (the chart's): `node.kubeconfig`, `node.kubectl`, `node.node_ip`, `node.images`
(name -> reference present on the node), `node.ctr_argv("images", "import", ARCHIVE)` for images of their own,
and `kubectl(node, ...)`, `pod_manifest(...)`, `wait_pod_ready(...)`, `node_namespace(...)` below.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from corral.devcluster.node import DevNode, NodePlane
from tests.harness import wait_for


def node_plane_session(state_dir: Path, say: Callable[[str], None]) -> Iterator[NodePlane]:
    if os.geteuid() != 0:
        pytest.skip(f"the real node needs root (kubelet, containerd, iptables); these tests run as uid {os.geteuid()}")
    node = DevNode(state_dir, say)
    try:
        yield node.up()
    finally:
        if node.claimed:  # else refused before anything started: another node holds the machine
            for line in node.down(purge=True):
                say(line)
            left = machine_leftovers()
            assert not left, f"`corral dev down` left the node's traces on this machine: {left}"


def machine_leftovers() -> list[str]:
    """What a removed node must not leave: the cni0 bridge and iptables chains of kube-proxy, CNI or kube-router."""
    left = []
    if Path("/sys/class/net/cni0").exists():
        left.append("the cni0 bridge")
    for family in ("iptables-save", "ip6tables-save"):
        saved = subprocess.run([family], capture_output=True, text=True, check=False).stdout
        chains = re.findall(r"^:((?:KUBE|CNI)-\S+)", saved, re.MULTILINE)
        if chains:
            left.append(f"{family}: chains {', '.join(sorted(set(chains))[:8])}")
    return left


def kubectl(node: NodePlane, *args: str, stdin: str | None = None, check: bool = True,
            timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """The plane's kubectl against the node's plane, as its admin."""
    done = subprocess.run(node.kubectl_argv(*args), input=stdin, capture_output=True, text=True, check=False,
                          timeout=timeout_s)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def apply(node: NodePlane, *manifests: dict[str, Any]) -> None:
    kubectl(node, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(manifests)}))


def get(node: NodePlane, kind: str, name: str, namespace: str) -> dict[str, Any]:
    return json.loads(kubectl(node, "get", kind, name, "-n", namespace, "-o", "json").stdout)


@contextmanager
def node_namespace(node: NodePlane, label: str, labels: dict[str, str] | None = None) -> Iterator[str]:
    """A new namespace for one test (deleted afterwards: the node's controller-manager empties it)."""
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:30]
    name = f"n-{slug}-{uuid.uuid4().hex[:5]}"
    apply(node, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
    try:
        yield name
    finally:
        kubectl(node, "delete", "namespace", name, "--wait=false", check=False)


def pod_manifest(node: NodePlane, name: str, namespace: str, command: list[str], *,
                 labels: dict[str, str] | None = None, volumes: list[dict[str, Any]] | None = None,
                 mounts: list[dict[str, Any]] | None = None, restricted: bool = True) -> dict[str, Any]:
    """A Pod of the busybox client image (never pulled), as uid 10001 with a read-only root by default: what
    the restricted Pod Security level admits."""
    container: dict[str, Any] = {"name": "main", "image": node.images["busybox"], "imagePullPolicy": "Never",
                                 "command": command, "volumeMounts": mounts or []}
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes or [], "terminationGracePeriodSeconds": 1}
    if restricted:
        spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                                   "seccompProfile": {"type": "RuntimeDefault"}}
        container["securityContext"] = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                            "labels": labels or {}}, "spec": spec}


def wait_pod_ready(node: NodePlane, name: str, namespace: str, timeout_s: float = 60) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = get(node, "pod", name, namespace)
        conditions = pod.get("status", {}).get("conditions", [])
        return pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None
    return wait_for(ready, f"Pod {namespace}/{name} Ready", timeout_s=timeout_s, interval_s=0.3)


def exec_in(node: NodePlane, name: str, namespace: str, *command: str,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    return kubectl(node, "exec", name, "-n", namespace, "--", *command, check=check)
