"""The node's add-ons that k3s bundles, built from their Go modules: CoreDNS, local-path-provisioner, kube-router.

Each is `go install`ed once per pinned version into the Corral cache (gobuild.py) and packed into an image
(images.py); the node runs them as k3s does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corral.devcluster.gobuild import GoProgram, Progress, ensure_go_binary

# The newest patch of CoreDNS 1.14, a line with months of fixes behind it; 1.15.0 is a fresh minor release.
COREDNS = GoProgram(name="coredns", package="github.com/coredns/coredns", version="v1.14.7", binary="coredns")

# A release k3s has shipped, and the newest the module proxy serves here (v0.0.31 and later answer 403).
LOCAL_PATH_PROVISIONER = GoProgram(
    name="local-path-provisioner",
    package="github.com/rancher/local-path-provisioner",
    version="v0.0.30",
    binary="local-path-provisioner",
)

# Upstream kube-router, verified by the checksum database: the newest v2 release the proxy serves here (v2.2.0
# and later answer 403). k3s embeds the policy controller of its fork (github.com/k3s-io/kube-router/v2
# v2.6.3-k3s1), which the proxy serves only with GONOSUMDB, i.e. without the checksum database's guarantee.
KUBE_ROUTER = GoProgram(
    name="kube-router",
    package="github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
    version="v2.1.0",
    binary="kube-router",
    ldflags="-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v2.1.0",
)


@dataclass(frozen=True)
class AddonBinaries:
    coredns: Path
    local_path_provisioner: Path
    kube_router: Path


def ensure_coredns(progress: Progress = print) -> Path:
    return ensure_go_binary(COREDNS, progress)


def ensure_local_path_provisioner(progress: Progress = print) -> Path:
    return ensure_go_binary(LOCAL_PATH_PROVISIONER, progress)


def ensure_kube_router(progress: Progress = print) -> Path:
    return ensure_go_binary(KUBE_ROUTER, progress)


def ensure_addon_binaries(progress: Progress = print) -> AddonBinaries:
    """Build (or find) all three, one after the other: two Go builds at once only share the same cores."""
    return AddonBinaries(
        coredns=ensure_coredns(progress),
        local_path_provisioner=ensure_local_path_provisioner(progress),
        kube_router=ensure_kube_router(progress),
    )


if __name__ == "__main__":  # pragma: no cover - for scripts/bootstrap: build all three with progress on stderr
    import sys

    built = ensure_addon_binaries(lambda line: print(line, file=sys.stderr, flush=True))
    print(built.coredns, built.local_path_provisioner, built.kube_router, sep="\n")
