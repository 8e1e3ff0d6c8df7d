"""Every firmware module compiles with mpy-cross (MicroPython's bytecode compiler), boards' modules included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware"
MODULES = sorted(path.relative_to(FIRMWARE).as_posix() for path in (FIRMWARE / "corral_fw").rglob("*.py"))
MPY_MAGIC = ord("M")
MPY_VERSION = 6


def test_the_firmware_has_the_modules_a_board_needs() -> None:
    for module in ("device.py", "actuators.py", "dedup.py", "debounce.py", "transport_umqtt.py", "board.py"):
        assert f"corral_fw/{module}" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_module_compiles_with_mpy_cross(module: str, tmp_path: Path) -> None:
    output = tmp_path / (Path(module).stem + ".mpy")
    result = subprocess.run(
        [sys.executable, "-m", "mpy_cross", "-o", str(output), str(FIRMWARE / module)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, f"mpy-cross {module}: {result.stderr or result.stdout}"
    header = output.read_bytes()[:2]
    assert header[0] == MPY_MAGIC and header[1] == MPY_VERSION, f"not a v{MPY_VERSION} .mpy file: {header!r}"


def test_mpy_cross_is_the_pinned_release() -> None:
    result = subprocess.run([sys.executable, "-m", "mpy_cross", "--version"], capture_output=True, text=True, timeout=60)
    assert "MicroPython v1.29" in result.stdout + result.stderr
