"""The firmware core on the real MicroPython interpreter, not only on CPython.

The official MicroPython WebAssembly port (npm: @micropython/micropython-webassembly-pyscript,
pinned in firmware/package.json and installed by scripts/bootstrap with `npm ci`)
runs under Node. It imports every core module and runs every test of
test_firmware_core.py, test_firmware_failsafe.py, test_firmware_max_on.py and test_firmware_epoch.py, the same files pytest runs on CPython.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit import test_firmware_core, test_firmware_epoch, test_firmware_failsafe, test_firmware_max_on

REPO = Path(__file__).resolve().parents[2]
FIRMWARE = REPO / "firmware"
RUNNER = FIRMWARE / "mptest" / "run_micropython.mjs"
INTERPRETER = FIRMWARE / "node_modules" / "@micropython" / "micropython-webassembly-pyscript" / "micropython.wasm"
PACKAGE = FIRMWARE / "corral_fw"
# Modules that need a board (machine, umqtt) or CPython (paho): compiled by mpy-cross, not imported here.
NOT_IMPORTABLE_ON_THE_WASM_PORT = {"corral_fw.board", "corral_fw.transport_umqtt", "corral_fw.transport_paho"}


def core_modules() -> list[str]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(FIRMWARE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in NOT_IMPORTABLE_ON_THE_WASM_PORT:
            modules.append(name)
    return modules


def run_micropython(*args: str) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: run scripts/bootstrap (it installs Node.js and the MicroPython port)")
    if not INTERPRETER.exists():
        pytest.fail(f"MicroPython's WebAssembly port is missing ({INTERPRETER}): run scripts/bootstrap (npm ci in firmware/)")
    return subprocess.run(
        [node, str(RUNNER), "--package", str(PACKAGE), *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


def test_every_core_module_imports_on_micropython() -> None:
    modules = core_modules()
    assert "corral_fw.device" in modules and "corral_fw.contracts.env_fan" in modules
    result = run_micropython("--import", ",".join(modules))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("IMPLEMENTATION micropython 1.27"), lines[0]
    assert [line.split()[1] for line in lines if line.startswith("IMPORTED ")] == modules


def test_the_core_tests_pass_on_micropython() -> None:
    _every_test_passes_on_micropython(test_firmware_core)


def test_the_failsafe_tests_pass_on_micropython() -> None:
    """The heartbeat countdown and the failsafe (test_firmware_failsafe.py), on the interpreter boards run."""
    _every_test_passes_on_micropython(test_firmware_failsafe)


def test_the_on_time_limit_tests_pass_on_micropython() -> None:
    """The on-time limit (test_firmware_max_on.py): the relay and the heater go off by themselves, on the
    interpreter boards run."""
    _every_test_passes_on_micropython(test_firmware_max_on)


def test_the_epoch_tests_pass_on_micropython() -> None:
    """The controller epoch check (test_firmware_epoch.py): epochs are ms timestamps past 2**31, so this also proves
    the board's ints and JSON carry them."""
    _every_test_passes_on_micropython(test_firmware_epoch)


def _every_test_passes_on_micropython(module: ModuleType) -> None:
    """Load the test module's file on MicroPython and run each of its test_* functions there: all pass."""
    result = run_micropython("--tests", str(Path(str(module.__file__))))
    output = result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines and lines[0].startswith("IMPLEMENTATION micropython"), output
    assert not [line for line in lines if line.startswith("FAIL ")], output
    passed = {line.split()[1] for line in lines if line.startswith("PASS ")}
    expected = {name for name in dir(module) if name.startswith("test_")}
    assert passed == expected, f"ran on MicroPython: {sorted(passed)}; in the file: {sorted(expected)}"
    assert result.returncode == 0, output
