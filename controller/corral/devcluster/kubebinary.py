"""Finding or building `corral-kube`: etcd, kube-apiserver and kubectl, and a node's kubelet, kube-scheduler,
kube-controller-manager and kube-proxy, in one binary.

The binary is built from our Go module in `tools/kube/` with the Kubernetes Go
modules, because prebuilt Kubernetes binaries cannot be downloaded where Corral
is developed. A cold build takes many minutes, so the result is cached in the
user cache directory under a key made of the Kubernetes version and a hash of
the module's sources: editing `tools/kube/` rebuilds, nothing else does.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.devcluster.errors import DevClusterError
from corral.devcluster.gobuild import cache_root, run_go_with_progress

Progress = Callable[[str], None]

BINARY_NAME = "corral-kube"


@dataclass(frozen=True)
class KubeBinary:
    """A built corral-kube and the kubectl link that dispatches to it."""

    path: Path
    kubectl: Path
    version: str


def source_dir() -> Path:
    """Where the Go module lives: `CORRAL_KUBE_SOURCE`, else the repository's `tools/kube`."""
    override = os.environ.get("CORRAL_KUBE_SOURCE")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "tools" / "kube"


def kube_version(src: Path) -> str:
    """The Kubernetes release pinned in the module's go.mod, e.g. `v1.36.3`."""
    go_mod = src / "go.mod"
    try:
        text = go_mod.read_text()
    except FileNotFoundError:
        raise DevClusterError(
            f"cannot find {go_mod}; corral dev needs a source checkout of Corral "
            "(or CORRAL_KUBE_SOURCE pointing at tools/kube, or CORRAL_KUBE_BINARY at a built binary)"
        ) from None
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\d+\.\d+\.\d+)\s*$", text, re.MULTILINE)
    if not match:
        raise DevClusterError(f"{go_mod} does not require k8s.io/kubernetes at a release version")
    return match.group(1)


def source_hash(src: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted([src / "go.mod", src / "go.sum", *src.glob("*.go")]):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def expected_binary() -> Path:
    """Where the binary for the current sources is (or will be once built); builds nothing."""
    prebuilt = os.environ.get("CORRAL_KUBE_BINARY")
    if prebuilt:
        return Path(prebuilt)
    src = source_dir()
    return cache_root() / "kube" / f"{kube_version(src)}-{source_hash(src)}" / BINARY_NAME


def ensure_binary(progress: Progress = print) -> KubeBinary:
    """Return the cached binary for the current sources, building it first if needed."""
    prebuilt = os.environ.get("CORRAL_KUBE_BINARY")
    if prebuilt:
        return _link_kubectl(Path(prebuilt), _binary_version(Path(prebuilt)), Path(prebuilt).parent)

    src = source_dir()
    version = kube_version(src)
    binary = expected_binary()
    target_dir = binary.parent
    if binary.exists():
        return _link_kubectl(binary, version, target_dir)

    target_dir.mkdir(parents=True, exist_ok=True)
    # One build at a time per cache entry: `corral dev up` and a test run may
    # start together, and two cold builds on two cores take twice as long.
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            _build(src, version, binary, progress)
    return _link_kubectl(binary, version, target_dir)


def _link_kubectl(binary: Path, version: str, directory: Path) -> KubeBinary:
    kubectl = directory / "kubectl"
    if not kubectl.is_symlink():
        kubectl.unlink(missing_ok=True)
        kubectl.symlink_to(binary)
    return KubeBinary(path=binary, kubectl=kubectl, version=version)


def _binary_version(binary: Path) -> str:
    try:
        out = subprocess.run([str(binary), "version"], capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as err:
        raise DevClusterError(f"{binary} does not run as corral-kube: {err}") from None
    return out.stdout.strip()


def _ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    # Both version packages: kube-apiserver reports component-base's, kubectl's
    # client side reports client-go's.
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _build(src: Path, version: str, binary: Path, progress: Progress) -> None:
    go = shutil.which("go")
    if go is None:
        raise DevClusterError(
            "Go is needed to build the local control plane (corral-kube) and was not found on PATH; "
            "install Go 1.26 or newer and run the command again"
        )
    env = {**os.environ, "CGO_ENABLED": "0"}
    progress(
        f"building {BINARY_NAME} (etcd, kube-apiserver, kubectl and the node components of {version}) from {src}; "
        "a cold build takes many minutes (about 12 on two cores, plus module downloads); later starts reuse it"
    )
    total = _package_count(go, src, env)
    partial = binary.with_name(binary.name + ".partial")
    command = [go, "build", "-v", "-trimpath", "-ldflags", _ldflags(version), "-o", str(partial), "."]
    started = time.monotonic()
    returncode, _compiled, errors = run_go_with_progress(command, env, BINARY_NAME, progress, cwd=src, total=total)
    if returncode != 0:
        partial.unlink(missing_ok=True)
        detail = "\n".join(errors[-30:]) or "(no output)"
        raise DevClusterError(f"building {BINARY_NAME} failed (go build exit {returncode}):\n{detail}")
    partial.rename(binary)
    elapsed = time.monotonic() - started
    size_mib = binary.stat().st_size / 2**20
    progress(f"built {binary} in {elapsed:.0f}s ({size_mib:.0f} MiB)")


def _package_count(go: str, src: Path, env: dict[str, str]) -> int | None:
    try:
        out = subprocess.run(
            [go, "list", "-deps", "."], cwd=src, env=env, capture_output=True, text=True, timeout=300, check=True
        )
    except (subprocess.SubprocessError, OSError):
        return None  # the count only decorates progress; the build reports real errors
    return len(out.stdout.split())


if __name__ == "__main__":  # pragma: no cover - convenience for CI logs
    print(ensure_binary(lambda line: print(line, file=sys.stderr, flush=True)).path)
