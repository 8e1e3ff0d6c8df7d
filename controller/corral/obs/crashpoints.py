"""Fixed crash points on an Intent's path (and a Rule's firing), for tests: `CORRAL_CRASH_AT=<step>` kills the controller there.

The crash tests (tests/integration/test_crash_points.py) kill the controller with SIGKILL in each gap that
the order of writes opens, and prove that a restarted controller ends the Intent exactly once with the same
command id. A kill from outside cannot hit a gap of a few milliseconds reliably; a point in the code can.
The variable is read once, at import: unset (always, outside those tests) each point is one comparison with
None. The step is named on stderr before the kill, so the test can tell where the process died.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

ENV = "CORRAL_CRASH_AT"

# In the order an executed Intent passes them.
EXECUTING_RECORDED = "executing-recorded"  # intent.executing fsynced, before the target apply
TARGET_APPLIED = "target-applied"  # the target apply answered, before the command is sent
COMMAND_SENT = "command-sent"  # the Intent's command published, before its ack
ACK_RECEIVED = "ack-received"  # the ack in hand, before intent.decided is recorded
DECIDED_RECORDED = "decided-recorded"  # intent.decided fsynced, before the final status write
FINAL_WRITTEN = "final-written"  # the final status written, before the Device's status write
STEPS = (EXECUTING_RECORDED, TARGET_APPLIED, COMMAND_SENT, ACK_RECEIVED, DECIDED_RECORDED, FINAL_WRITTEN)
# A Rule's firing: its status names the Intents (pending), before they are created (tests/integration/test_rules.py).
RULE_NAMED = "rule-named"
POINTS = (*STEPS, RULE_NAMED)


def step_from(environ: Mapping[str, str]) -> str | None:
    """The armed step, or None; a name that is not a step is refused, so a typo cannot silently test nothing."""
    step = environ.get(ENV) or None
    if step is not None and step not in POINTS:
        raise ValueError(f"{ENV}={step!r} names no crash point; the steps are: {', '.join(POINTS)}")
    return step


_ARMED = step_from(os.environ)


def armed(step: str) -> bool:
    """True when the process is to die at this step (for the rare point that prepares its crash)."""
    return step == _ARMED


def crash_point(step: str) -> None:
    """SIGKILL this process here if CORRAL_CRASH_AT names this step: no cleanup, no goodbye, like a lost node."""
    if _ARMED is not None and step == _ARMED:
        sys.stderr.write(f"corral: crash point {step} reached ({ENV}): killing this process with SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
