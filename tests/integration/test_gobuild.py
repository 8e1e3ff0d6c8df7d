"""`go install MODULE@VERSION` into the Corral cache, through the module proxy, as the node's add-ons are built."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from corral.devcluster.errors import DevClusterError
from corral.devcluster.gobuild import GoProgram, cached_binary, ensure_go_binary

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("go") is None, reason="needs Go on PATH (the module proxy builds the add-ons)"),
]

# A small module the proxy serves: Go's own example program.
HELLO = GoProgram(name="hello", package="golang.org/x/example/hello",
                  version="v0.0.0-20250915201037-7f05d217867b", binary="hello")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CORRAL_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_program_is_built_into_its_cache_entry_once_and_runs(cache: Path) -> None:
    said: list[str] = []
    binary = ensure_go_binary(HELLO, said.append)
    assert binary == cache / "hello" / HELLO.version / "hello" == cached_binary(HELLO)
    assert said[0].startswith(f"building hello from its Go module ({HELLO.spec})")
    assert said[-1].startswith(f"built {binary} in ")
    assert "Hello" in subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    assert [p.name for p in binary.parent.iterdir() if not p.name.startswith(".")] == ["hello"]
    before = len(said)
    assert ensure_go_binary(HELLO, said.append) == binary
    assert said[before:] == [], "a cached program is not built again"


def test_a_version_the_proxy_does_not_serve_is_named_in_the_error() -> None:
    missing = GoProgram(name="hello", package=HELLO.package, version="v0.0.0-20000101000000-000000000000",
                        binary="hello")
    with pytest.raises(DevClusterError, match=r"building hello \(golang.org/x/example/hello@v0\.0\.0-2000.*\) failed"):
        ensure_go_binary(missing, lambda line: None)
    assert not cached_binary(missing).exists()
