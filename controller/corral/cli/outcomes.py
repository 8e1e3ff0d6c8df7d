"""What the exit status of a command that asks for something says: done, refused, failed, or not decided yet.

A script (or a person reading `$?`) must tell a denial from a success without parsing the message; the
statuses are listed in `corral --help` (cli/main.py EXIT_CODES) and are the same for every command that asks.
"""

from __future__ import annotations

from typing import Final

from corral.api.codes import DECISION_CODES, phase_of

DONE: Final = 0
ERROR: Final = 1  # click's own: an error before any outcome (kubeconfig, the API server refused)
USAGE: Final = 2  # click's own: a bad option or argument
REFUSED: Final = 3  # nothing ran: a DENY_* code, DENIED_BY_APPROVER, RATE_LIMITED, CANCELLED; an Approval refused
NOT_DONE: Final = 4  # allowed, but it did not happen (or may not have): FAILED, TIMEOUT, DEVICE_GONE
UNDECIDED: Final = 5  # AWAITING_APPROVAL, or still PENDING when the wait ran out


def exit_status(outcome: str) -> int:
    """The exit status for an Intent's outcome code (client.intents.outcome_code)."""
    if outcome in ("EXECUTED", "DEDUP"):
        return DONE
    if outcome in DECISION_CODES:
        return REFUSED if phase_of(outcome) == "Denied" else NOT_DONE
    return UNDECIDED  # AWAITING_APPROVAL, PENDING, or a code this version does not know yet
