"""Building a Go program from its module (`go install MODULE/PKG@VERSION`) into the Corral cache, with progress.

Nothing prebuilt can be downloaded where Corral is developed, but the Go module proxy is reachable, so the
tools the local plane and the tests need (Helm, CoreDNS, local-path-provisioner, kube-router) are compiled
once per version into `<cache>/<name>/<version>/<binary>` and reused afterwards. One lock per entry: two
processes asking for the same tool wait for one build instead of running two on the same cores.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from corral.devcluster.errors import DevClusterError

Progress = Callable[[str], None]

_PROGRESS_EVERY_S = 15.0


@dataclass(frozen=True)
class GoProgram:
    """One program to `go install`: where it comes from and where the cache keeps it."""

    name: str  # the cache directory, e.g. "coredns"
    package: str  # the main package's import path, e.g. "github.com/coredns/coredns"
    version: str  # a module version the proxy serves, e.g. "v1.14.7"
    binary: str  # the file `go install` writes, the last element of the package path
    ldflags: str = "-s -w"
    # Extra environment, e.g. {"GONOSUMDB": "github.com/k3s-io/*"} for a module the checksum database lacks.
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"


def cache_root() -> Path:
    """Where every cold build of Corral's tools is kept: `CORRAL_CACHE_DIR`, else the user cache directory."""
    return Path(os.environ.get("CORRAL_CACHE_DIR") or platformdirs.user_cache_dir("corral"))


def cached_binary(program: GoProgram) -> Path:
    """Where the program is (or will be once built); builds nothing."""
    return cache_root() / program.name / program.version / program.binary


def ensure_go_binary(program: GoProgram, progress: Progress = print) -> Path:
    """Return the cached binary of `program`, building it first (locked per cache entry) when it is missing."""
    binary = cached_binary(program)
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    with open(binary.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.is_file():
            _install(program, binary, progress)
    return binary


def _install(program: GoProgram, binary: Path, progress: Progress) -> None:
    go = shutil.which("go")
    if go is None:
        raise DevClusterError(
            f"Go is needed to build {program.name} ({program.spec}) and was not found on PATH; "
            "install Go 1.26 or newer and run the command again"
        )
    progress(f"building {program.name} from its Go module ({program.spec}); "
             f"a cold build takes a few minutes, cached in {binary.parent}")
    # GOBIN is a fresh directory beside the entry: the binary appears at its final path only once complete.
    with tempfile.TemporaryDirectory(dir=binary.parent, prefix=".gobin-") as gobin:
        env = {**os.environ, "GOBIN": gobin, "CGO_ENABLED": "0", **program.env}
        command = [go, "install", "-v", "-trimpath", "-ldflags", program.ldflags, program.spec]
        started = time.monotonic()
        code, compiled, errors = run_go_with_progress(command, env, program.name, progress)
        built = Path(gobin) / program.binary
        if code != 0 or not built.is_file():
            detail = "\n".join(errors[-30:]) or "(no output)"
            raise DevClusterError(f"building {program.name} ({program.spec}) failed (go install exit {code}):\n{detail}")
        built.rename(binary)
    size_mib = binary.stat().st_size / 2**20
    progress(f"built {binary} in {time.monotonic() - started:.0f}s ({compiled} packages, {size_mib:.0f} MiB)")


def run_go_with_progress(command: list[str], env: Mapping[str, str], name: str, progress: Progress,
                         cwd: Path | None = None, total: int | None = None) -> tuple[int, int, list[str]]:
    """Run `go build -v` or `go install -v`, reporting every few seconds how far it is; (exit code, packages
    compiled, diagnostics). `total`, when known (`go list -deps`), is shown beside the packages compiled."""
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    compiled = downloaded = 0
    errors: list[str] = []
    done = threading.Event()

    def report() -> None:
        # Linking prints nothing for a long while, so progress runs on a clock.
        while not done.wait(_PROGRESS_EVERY_S):
            elapsed = int(time.monotonic() - started)
            modules = f"{downloaded} modules downloaded, " if downloaded else ""
            of_total = f"/{total}" if total else ""
            progress(f"  ... {name}: {modules}{compiled}{of_total} packages compiled, "
                     f"{elapsed // 60}m{elapsed % 60:02d}s")

    threading.Thread(target=report, daemon=True).start()
    try:
        for line in proc.stderr:
            line = line.rstrip()
            # `-v` prints one import path per package compiled; anything else but a download is a diagnostic
            # worth keeping for the error message.
            if re.fullmatch(r"[\w.\-~/]+", line):
                compiled += 1
            elif line.startswith("go: downloading "):
                downloaded += 1
            elif line:
                errors.append(line)
        code = proc.wait()
    finally:
        done.set()
    return code, compiled, errors
