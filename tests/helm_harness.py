"""Helm for the chart tests, built from its Go modules (`go install helm.sh/helm/v3/cmd/helm@VERSION`).

Nothing can be downloaded here but modules from the registries, so Helm is compiled once per version
into the Corral cache (~/.cache/corral/helm/VERSION/helm) and reused afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.devcluster.gobuild import GoProgram, ensure_go_binary

HELM_VERSION = "v3.22.0"
HELM = GoProgram(name="helm", package="helm.sh/helm/v3/cmd/helm", version=HELM_VERSION, binary="helm",
                 env={"GOFLAGS": "-mod=mod"})
KUBE_VERSION = "1.36.3"  # what --kube-version tells helm lint and template: the local plane's


def helm_binary(progress: Callable[[str], None]) -> Path:
    return ensure_go_binary(HELM, progress)


class Helm:
    def __init__(self, binary: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HELM_CACHE_HOME": str(self.binary.parent / "home" / "cache"),
               "HELM_CONFIG_HOME": str(self.binary.parent / "home" / "config"),
               "HELM_DATA_HOME": str(self.binary.parent / "home" / "data")}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        done = subprocess.run([str(self.binary), *args], env=env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def status(self, release: str, namespace: str) -> dict[str, Any]:
        return json.loads(self("status", release, "-n", namespace, "-o", "json").stdout)
