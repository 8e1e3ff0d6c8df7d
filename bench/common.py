"""What the benchmarks share: a control plane to run on, percentiles, and where results go."""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))

from corral.devcluster.plane import DevPlane, Plane  # noqa: E402


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def bench_plane() -> Iterator[Plane]:
    """The plane of `corral dev up` in this checkout if it runs, else a fresh one removed afterwards."""
    plane = DevPlane(REPO / ".corral" / "dev", progress=say).running()
    if plane is not None:
        yield plane
        return
    own = DevPlane(Path(tempfile.mkdtemp(prefix="corral-bench-")), progress=say)
    try:
        yield own.up()
    finally:
        own.down(purge=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def write_result(name: str, result: dict[str, Any]) -> Path:
    result = {"benchmark": name, **result,
              "machine": f"{platform.machine()}, {platform.system()} {platform.release()}, "
                         f"Python {platform.python_version()}",
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path
