"""Helm for the chart tests, built from its Go modules (`go install helm.sh/helm/v3/cmd/helm@VERSION`).

Nothing can be downloaded here but modules from the registries, so Helm is compiled once per version
into the Corral cache (~/.cache/corral/helm/VERSION/helm) and reused afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.devcluster.kubebinary import cache_root

HELM_VERSION = "v3.22.0"
KUBE_VERSION = "1.36.3"  # what --kube-version tells helm lint and template: the local plane's


def helm_binary(progress: Callable[[str], None]) -> Path:
    binary = cache_root() / "helm" / HELM_VERSION / "helm"
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("Go is needed to build Helm for the chart tests; install Go and run again")
    progress(f"building Helm {HELM_VERSION} from its Go modules (a few minutes cold; cached in {binary.parent})")
    env = {**os.environ, "GOBIN": str(binary.parent), "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    started = time.monotonic()
    proc = subprocess.Popen([go, "install", "-v", f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    done = threading.Event()

    def report() -> None:
        while not done.wait(15):
            progress(f"  ... Helm: {len(lines)} packages, {int(time.monotonic() - started)}s")

    threading.Thread(target=report, daemon=True).start()
    try:
        lines.extend(line.rstrip() for line in proc.stderr)
        code = proc.wait()
    finally:
        done.set()
    if code != 0 or not binary.is_file():
        raise RuntimeError(f"building Helm failed (exit {code}):\n" + "\n".join(lines[-30:]))
    progress(f"built {binary} in {time.monotonic() - started:.0f}s")
    return binary


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
