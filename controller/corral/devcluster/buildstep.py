"""A long build command (buildah, mmdebstrap) run with what it is doing reported on a clock.

Such builds print a line per step, then nothing for a minute while pip or apt works; a person watching
`corral dev build --node` should see every few seconds which step is running and for how long.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

from corral.devcluster.gobuild import Progress

PROGRESS_EVERY_S = 15.0


def run_reporting(command: list[str], label: str, progress: Progress,
                  step: Callable[[list[str]], str]) -> tuple[int, list[str]]:
    """Run `command` (its stdout and stderr together); every few seconds report `label: step(lines so far)`.
    Returns the exit code and every line it printed, for the caller's error message."""
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            progress(f"  ... {label}: {step(lines) if lines else 'starting'} ({time.monotonic() - started:.0f}s)")

    threading.Thread(target=report, daemon=True).start()
    try:
        for line in proc.stdout:
            if line.strip():
                lines.append(line.rstrip())
        code = proc.wait()
    finally:
        done.set()
    return code, lines
