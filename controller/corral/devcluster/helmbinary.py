"""Helm, built from its Go module (`go install helm.sh/helm/v3/cmd/helm@VERSION`) into the Corral cache.

The node demo installs the chart with it as a k3s user does, and the chart tests use the same build: compiled once
per version into `~/.cache/corral/helm/VERSION/helm`, nothing downloaded but modules from the proxy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from corral.devcluster.gobuild import GoProgram, ensure_go_binary

HELM_VERSION = "v3.22.0"
HELM = GoProgram(name="helm", package="helm.sh/helm/v3/cmd/helm", version=HELM_VERSION, binary="helm",
                 env={"GOFLAGS": "-mod=mod"})


def ensure_helm(progress: Callable[[str], None] = print) -> Path:
    """The cached helm binary, built first (with progress, locked against a second build) when missing."""
    return ensure_go_binary(HELM, progress)


def helm_environment(binary: Path) -> dict[str, str]:
    """Helm's cache, configuration and data beside the binary: never the user's ~/.config/helm or repositories."""
    home = binary.parent / "home"
    return {"HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}
