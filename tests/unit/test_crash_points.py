"""The test-only crash points (corral.obs.crashpoints) and the order of an Intent's status writes around them.

The crash points themselves are exercised against the real controller in tests/integration/test_crash_points.py;
here: a misspelt step is refused, an armed one kills the process with SIGKILL after saying so, and an unarmed
one does nothing. Then the `Executing` status write that left the critical path: not written when the outcome
comes first, written when the execution outlasts its delay, and never landing after the final write.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest

from corral.obs.crashpoints import ENV, STEPS, step_from
from corral.reconcile.intents import execute
from corral.reconcile.intents.execute import ExecutionReconciler
from corral.reconcile.intents.facts import StoredIntent

RUN_POINTS = ("import sys; from corral.obs.crashpoints import crash_point, STEPS\n"
              "for step in STEPS:\n"
              "    crash_point(step)\n"
              "    print('passed', step, flush=True)\n")


def run_points(armed: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({ENV: armed} if armed is not None else {})}
    return subprocess.run([sys.executable, "-c", RUN_POINTS], env=env, capture_output=True, text=True, timeout=60)


def test_a_step_that_is_not_a_crash_point_is_refused_with_the_steps_there_are() -> None:
    with pytest.raises(ValueError, match="command-sent") as refused:
        step_from({ENV: "command-send"})
    assert "'command-send' names no crash point" in str(refused.value)
    assert all(step in str(refused.value) for step in STEPS)
    assert step_from({}) is None and step_from({ENV: ""}) is None
    assert step_from({ENV: "ack-received"}) == "ack-received"


def test_an_armed_crash_point_kills_the_process_there_and_says_so_first() -> None:
    done = run_points("ack-received")
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr)
    assert done.stdout.split("\n")[:-1] == [f"passed {step}" for step in STEPS[:STEPS.index("ack-received")]]
    assert "crash point ack-received reached" in done.stderr


def test_without_the_switch_every_crash_point_is_passed() -> None:
    done = run_points(None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"passed {step}" for step in STEPS]


class Writes:
    """What the Intent's status writes did, in order; `hold` keeps a write in flight until it is set."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.hold: asyncio.Event | None = None

    async def write(self, intent: Any, updates: dict[str, Any], reason: str) -> None:
        self.log.append(f"{reason} started")
        if self.hold is not None:
            await self.hold.wait()
        self.log.append(f"{reason} done")

    async def finish(self, intent: Any, view: Any, code: str, message: str, extra: dict[str, Any]) -> None:
        await self.write(intent, {"code": code}, "final")


def executor(writes: Writes) -> ExecutionReconciler:
    reconciler = ExecutionReconciler.__new__(ExecutionReconciler)
    reconciler.outcomes = cast(Any, writes)
    reconciler._later = {}
    return reconciler


INTENT = cast(StoredIntent, SimpleNamespace(metadata=SimpleNamespace(uid="u-1", namespace="home", name="lamp-on")))
EXECUTING = {"phase": "Executing", "command_id": "i-1"}


def test_an_outcome_ready_before_the_delay_is_the_only_status_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execute, "EXECUTING_STATUS_DELAY_S", 0.05)

    async def run() -> list[str]:
        writes = Writes()
        reconciler = executor(writes)
        reconciler._write_executing_later(INTENT, EXECUTING)
        later = reconciler._later["u-1"]
        await reconciler._finish(INTENT, None, "EXECUTED", "done", {})
        assert later.task is not None
        await asyncio.gather(later.task, return_exceptions=True)
        assert later.task.cancelled(), "the Executing write was postponed, not dropped"
        return writes.log

    assert asyncio.run(run()) == ["final started", "final done"]


def test_an_execution_that_outlasts_the_delay_shows_executing_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execute, "EXECUTING_STATUS_DELAY_S", 0.05)

    async def run() -> list[str]:
        writes = Writes()
        reconciler = executor(writes)
        reconciler._write_executing_later(INTENT, EXECUTING)
        while "executing done" not in writes.log:
            await asyncio.sleep(0.01)
        await reconciler._finish(INTENT, None, "TIMEOUT", "no ack", {})
        return writes.log

    assert asyncio.run(run()) == ["executing started", "executing done", "final started", "final done"]


def test_the_final_write_waits_for_an_executing_write_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execute, "EXECUTING_STATUS_DELAY_S", 0.01)

    async def run() -> list[str]:
        writes = Writes()
        writes.hold = asyncio.Event()
        reconciler = executor(writes)
        reconciler._write_executing_later(INTENT, EXECUTING)
        while "executing started" not in writes.log:
            await asyncio.sleep(0.005)
        finishing = asyncio.create_task(reconciler._finish(INTENT, None, "EXECUTED", "done", {}))
        await asyncio.sleep(0.05)
        assert writes.log == ["executing started"], "the final write went out while Executing was in flight"
        writes.hold.set()
        await finishing
        return writes.log

    assert asyncio.run(run()) == ["executing started", "executing done", "final started", "final done"]
