"""Dispatch: what the decision returned, carried out.

A final decision ends the Intent; a hold or a missing approval leaves it waiting (and says so once); a dry
run records what would have happened and does nothing; an Intent let through goes to its kind (kinds.py),
which reads, sets the overlay, changes the lease, or hands it to execution.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from corral.api.codes import DecisionCode
from corral.audit.decisions import DECIDED
from corral.decide.decision import Decision
from corral.kube.cache import Key
from corral.kube.typed import Body
from corral.kube.workqueue import Result
from corral.reconcile.devices.notices import device_ref
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.intents.facts import StoredIntent, status_of
from corral.reconcile.intents.kinds import Kinds
from corral.reconcile.intents.outcomes import Outcomes, cited
from corral.reconcile.intents.settings import DRY_RUN_TTL, HOLD_RECHECK_S, MESSAGE_LIMIT


class Dispatch:
    """Acts on a Decision about one Intent."""

    def __init__(self, outcomes: Outcomes, kinds: Kinds, on_awaiting: Callable[[Body], None] | None) -> None:
        self.outcomes = outcomes
        self.kinds = kinds
        self.on_awaiting = on_awaiting  # told once when an Intent starts waiting for a person (notifications)

    async def act(self, key: Key, intent: StoredIntent, view: DeviceView | None, decision: Decision,
                  now: datetime, digest: str) -> Result:
        base = {"params_hash": digest, "risk": decision.risk, "level": decision.level}
        if intent.spec.dry_run:
            return await self._dry_run(intent, view, decision, base)
        if decision.outcome == "final":
            assert decision.code is not None
            return await self.outcomes.finish(intent, view, decision.code, decision.message, base)
        if decision.outcome == "await_hold":
            return await self._hold(intent, decision, base, now)
        if decision.outcome == "await_approval":
            return await self._await_approval(intent, decision, base, now)
        return await self.kinds.of(intent.spec.action).act(key, intent, view, decision, base)

    async def _hold(self, intent: StoredIntent, decision: Decision, base: dict[str, Any], now: datetime) -> Result:
        """The device's changed contract waits for a person: Pending, and why (said once)."""
        assert decision.expires_at is not None
        if status_of(intent).message != decision.message:
            await self.outcomes.write(intent, {**base, "phase": "Pending", "message": decision.message}, "held")
            self.outcomes.event(intent, "WaitingForContract", "Decide", decision.message, "Warning")
        # Looked at again soon: a person's acceptance lifts the hold at any moment.
        return Result.after(max(0.1, min(HOLD_RECHECK_S, (decision.expires_at - now).total_seconds() + 0.1)))

    async def _await_approval(self, intent: StoredIntent, decision: Decision, base: dict[str, Any],
                              now: datetime) -> Result:
        """It needs a person's approval: AwaitingApproval (once, with a notification), until it expires."""
        assert decision.expires_at is not None
        status = status_of(intent)
        if status.phase != "AwaitingApproval":
            _, written = await self.outcomes.write_answer(
                intent, {**base, "phase": "AwaitingApproval", "message": decision.message,
                         "approval_expires_at": decision.expires_at}, "awaiting-approval")
            self.outcomes.event(intent, "AwaitingApproval", "Decide", decision.message)
            if self.on_awaiting is not None:
                self.on_awaiting(written)
        elif status.message != decision.message[:MESSAGE_LIMIT] or status.params_hash != base["params_hash"]:
            # A refused approval; or a hash computed otherwise since it began to wait (a hold's then is in it now):
            # approvals are made for the one written here, so it must be the one they are judged against.
            await self.outcomes.write(intent, {"message": decision.message, "params_hash": base["params_hash"]},
                                      "awaiting-approval")
        return Result.after(max(0.1, (decision.expires_at - now).total_seconds() + 0.1))

    async def _dry_run(self, intent: StoredIntent, view: DeviceView | None, decision: Decision,
                       base: dict[str, Any]) -> Result:
        """Every check ran; the outcome is recorded and shown, and nothing is executed, now or ever."""
        code: DecisionCode | None = "EXECUTED" if decision.outcome == "execute" else decision.code
        if decision.outcome == "execute":
            doing = self.kinds.of(intent.spec.action).doing(intent, decision)
            message = f"Dry run: every check passed; it would {doing}. Nothing was executed."
        elif decision.outcome == "final":
            message = f"Dry run: it would end {code}: {decision.message}"
        else:
            message = f"Dry run: it would wait: {decision.message} Nothing was executed."
        status = {**base, "phase": "DryRun", "code": code, "would": decision.outcome,
                  "message": message[:MESSAGE_LIMIT], "decided_at": datetime.now(UTC).replace(microsecond=0)}
        sealed = await self.outcomes.record(DECIDED, intent, {"code": code, "message": status["message"],
                                                              "dryRun": True, "would": decision.outcome, **base})
        status["audit"] = cited(sealed)
        written = await self.outcomes.write(intent, status, "dry-run")
        self.outcomes.event(written, "DryRun", "Decide", f"{message} (requested by {intent.spec.requester})",
                            "Normal", device_ref(view.body) if view is not None else None)
        return Result.after(DRY_RUN_TTL.total_seconds())
