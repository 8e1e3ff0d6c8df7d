"""Helm for the chart tests: the product's own build (corral/devcluster/helmbinary.py, cached in
~/.cache/corral/helm/VERSION/helm), and a small runner for it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.devcluster.helmbinary import ensure_helm, helm_environment

KUBE_VERSION = "1.36.3"  # what --kube-version tells helm lint and template: the local plane's


def helm_binary(progress: Callable[[str], None]) -> Path:
    return ensure_helm(progress)


class Helm:
    def __init__(self, binary: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **helm_environment(self.binary)}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        done = subprocess.run([str(self.binary), *args], env=env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def status(self, release: str, namespace: str) -> dict[str, Any]:
        return json.loads(self("status", release, "-n", namespace, "-o", "json").stdout)
