"""The Intent controller's settings and the few timings every part of it shares.

Apart from the reconcilers so that the command line and the assembly can build settings without importing
the controller, and so that each part of the pipeline reads the same limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from corral.decide.decision import Policy

MESSAGE_LIMIT = 1024
HOLD_RECHECK_S = 2.0
AUDIT_RECHECK_S = 1.0
AUDIT_CONDITION = "AuditLogWritable"
DRY_RUN_TTL = timedelta(minutes=10)  # a dry run's answer is read at once; it is not kept as long as others


@dataclass(frozen=True)
class IntentSettings:
    policy: Policy = field(default_factory=Policy)
    execution_timeout_s: float = 10.0
    # How long a finished Intent is kept after it was decided (as a Job's ttlSecondsAfterFinished): objects
    # that are kept cost the API server on every list and watch; idempotency outlives them (audit.requests).
    retention: timedelta = timedelta(hours=1)
    decision_workers: int = 8
    # Executions wait for devices; each worker waits for one device at a time.
    execution_workers: int = 32
