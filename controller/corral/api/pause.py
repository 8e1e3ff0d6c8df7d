"""AgentPause: the agents kill switch of one namespace. While `spec.paused` is true, every Intent there whose
requester is not a person (decide/approvals.py, `People`) ends DENY_PAUSED, at its decision and again right
before it would run; people's Intents still run.

One object per namespace, named `agents`; people write it (`corral agents pause` / `resume`, the approver
role), and an admission policy makes `spec.by` the username of whoever writes it, on every write. The
controller notes each change in its audit log, posts an Event, and says in `status` that it enforces it;
the gateway and the approval page read it to say that agents are paused, and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import Field

from corral.api.base import KubeModel, Resource, Text512, Text1024
from corral.contract.text import written_text

PAUSE_NAME: Final = "agents"  # the agents' AgentPause of a namespace
RULES_PAUSE_NAME: Final = "rules"  # the Rules' own switch: the agents' pause does not stop a person's Rules


class AgentPauseSpec(KubeModel):
    """Whether agents are paused in this namespace, why, by whom and since when."""

    paused: bool = Field(
        description=("True: every Intent in this namespace whose requester is not a person (a ServiceAccount "
                     "outside the people namespace) ends DENY_PAUSED; people's Intents still run. False: resumed.")
    )
    reason: Text512 = Field(default="", description="Why, in a sentence; agents are shown it.")
    by: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        description="Username of whoever paused or resumed last; the API server rejects any other value."
    )
    since: datetime = Field(description="When agents were paused (or resumed).")


class AgentPauseStatus(KubeModel):
    """What the controller made of it; written only by the controller."""

    enforced: bool = Field(default=False, description="True while the controller denies agents' Intents here.")
    observed_generation: int | None = Field(default=None, ge=0, description="The generation the controller saw.")
    message: Text1024 = Field(default="", description="What is in effect, in a sentence.")


class AgentPause(Resource):
    """The agents kill switch of a namespace: while paused, only people's Intents run."""

    kind_name = "AgentPause"
    plural = "agentpauses"
    singular = "agentpause"
    scope = "Namespaced"
    short_names = ["pause"]
    printer_columns = [
        {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"},
        {"name": "Reason", "type": "string", "jsonPath": ".spec.reason"},
        {"name": "By", "type": "string", "jsonPath": ".spec.by"},
        {"name": "Since", "type": "string", "format": "date-time", "jsonPath": ".spec.since"},
        {"name": "Enforced", "type": "boolean", "jsonPath": ".status.enforced"},
    ]
    root_validations = [
        {"rule": f"self.metadata.name in ['{PAUSE_NAME}', '{RULES_PAUSE_NAME}']",
         "message": f"an AgentPause is named {PAUSE_NAME} (agents: corral agents pause -n NS) or {RULES_PAUSE_NAME} "
                    "(Rules: corral rules pause -n NS); there is one of each per namespace"},
    ]

    kind: Literal["AgentPause"] = "AgentPause"
    spec: AgentPauseSpec = Field(description="The switch.")
    status: AgentPauseStatus | None = Field(default=None, description="Enforcement, written by the controller.")


@dataclass(frozen=True)
class Paused:
    """Agents are paused in a namespace: by whom, why and since when (what every refusal says)."""

    namespace: str
    by: str
    reason: str = ""
    since: datetime | None = None

    def sentence(self, what: str = "Agents") -> str:
        since = f" since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since is not None else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{what} are paused in namespace {self.namespace}{since} by {self.by}{why}."

    def resume_hint(self, what: str = "agents") -> str:
        return (f"Nothing {'an agent asks for' if what == 'agents' else 'a Rule does'} there runs until a person "
                f"resumes {what} (corral {what} resume -n {self.namespace}).")


def paused_of(body: Mapping[str, Any] | None) -> Paused | None:
    """The pause an AgentPause object (as the API server returns it) puts in force; None when it is resumed.

    Read leniently: the API server validated the schema, and a switch that says paused is paused even if
    another field cannot be read."""
    if not body:
        return None
    spec = body.get("spec") or {}
    if spec.get("paused") is False or "paused" not in spec:
        return None
    meta = body.get("metadata") or {}
    since = spec.get("since")
    try:
        at = datetime.fromisoformat(since.replace("Z", "+00:00")) if isinstance(since, str) else None
    except ValueError:
        at = None
    return Paused(namespace=str(meta.get("namespace") or ""), by=str(spec.get("by") or "someone"),
                  reason=written_text(spec.get("reason")), since=at)  # agents are told it: made safe
