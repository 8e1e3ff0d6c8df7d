"""What the cluster, not the device, decides about a contract: risk floors and which changes need a person. Pure.

A device declares each actuator's risk in its own contract, so a device (or anything holding its
credential) could declare `risk: low` for a lock. The cluster therefore keeps two safeguards:

- **Risk floors**, from the controller's configuration (never from the Device or its contract): per device
  model, per model and actuator, per Device, or per Device and actuator. The effective risk of an action
  is the highest of the contract's and every floor that applies; a contract can raise risk, never lower it.
- **Contract holds**: a changed contract that asks for more trust than the one a person accepted (risk lowered,
  an actuator added, a range widened, enum values added, an action, type, level, unit or step changed, the
  model changed, an on-time limit raised or removed or a required hold dropped, or anything else about an
  actuator) holds the Device until a person accepts it. So does a change of the words people and agents read
  (the product name, an actuator's name or description) and of what the device reports (its sensor and event
  lists, units and descriptions): they steer how people and agents judge the device, and every changed contract
  is a new Capability, so a device re-announcing new words each time would otherwise mint cluster-wide objects
  at will. Narrowing changes (an actuator removed, a range narrowed, an on-time limit lowered or added, a hold
  required where it was not, new firmware with the same contract otherwise) are accepted by themselves. A
  sensor's publish interval counts by what it does to the freshness limit of cited readings
  (contract.freshness): lengthened, it is held; shortened, it is not; declared where a contract had none, it is
  held only if readings would count as fresh for longer than the cluster's default allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from corral.contract.canonical import capability_hash
from corral.contract.diff import limit_widenings, wording_changes
from corral.contract.freshness import DEFAULT_RULE, FreshnessRule
from corral.contract.model import Actuator, Contract, Risk

RISKS: tuple[Risk, ...] = ("low", "medium", "high", "critical")


def risk_rank(risk: Risk) -> int:
    return RISKS.index(risk)


def highest(*risks: Risk | None) -> Risk:
    present = [r for r in risks if r is not None]
    return max(present, key=risk_rank) if present else "low"


@dataclass(frozen=True)
class RiskFloors:
    """Floors by model (`model`, `model/actuator`) and by Device (`namespace/name`, `namespace/name/actuator`)."""

    by_model: Mapping[str, Risk] = field(default_factory=dict)
    by_device: Mapping[str, Risk] = field(default_factory=dict)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> RiskFloors:
        """`MODEL[/ACTUATOR]=RISK` or `device:NAMESPACE/NAME[/ACTUATOR]=RISK`; ValueError says what is wrong."""
        by_model: dict[str, Risk] = {}
        by_device: dict[str, Risk] = {}
        for entry in entries:
            key, sep, risk = entry.partition("=")
            key, risk = key.strip(), risk.strip()
            if not sep or not key or risk not in RISKS:
                raise ValueError(f"risk floor {entry!r}: expected MODEL[/ACTUATOR]=RISK or "
                                 f"device:NAMESPACE/NAME[/ACTUATOR]=RISK with RISK one of {', '.join(RISKS)}")
            if key.startswith("device:"):
                target = key.removeprefix("device:")
                if not 2 <= len(target.split("/")) <= 3 or not all(target.split("/")):
                    raise ValueError(f"risk floor {entry!r}: a Device floor names NAMESPACE/NAME[/ACTUATOR]")
                by_device[target] = risk
            else:
                if not 1 <= len(key.split("/")) <= 2 or not all(key.split("/")):
                    raise ValueError(f"risk floor {entry!r}: a model floor names MODEL[/ACTUATOR]")
                by_model[key] = risk
        return cls(by_model, by_device)

    def floor(self, model: str, actuator: str, namespace: str = "", device: str = "") -> Risk | None:
        found: list[Risk | None] = [self.by_model.get(model), self.by_model.get(f"{model}/{actuator}")]
        if namespace and device:
            found += [self.by_device.get(f"{namespace}/{device}"), self.by_device.get(f"{namespace}/{device}/{actuator}")]
        return highest(*found) if any(r is not None for r in found) else None

    def __bool__(self) -> bool:
        return bool(self.by_model or self.by_device)


def with_floors(contract: Contract, floors: RiskFloors, namespace: str = "", device: str = "") -> Contract:
    """The contract with each actuator's risk raised to its floors: what decisions use."""
    if not floors:
        return contract
    raised = []
    for actuator in contract.actuators:
        risk = highest(actuator.risk, floors.floor(contract.model, actuator.id, namespace, device))
        raised.append(actuator if risk == actuator.risk else actuator.model_copy(update={"risk": risk}))
    return contract.model_copy(update={"actuators": raised})


def widenings(accepted: Contract, announced: Contract, freshness: FreshnessRule = DEFAULT_RULE) -> list[str]:
    """What in `announced` asks for more trust than `accepted`; empty when it may be accepted by itself.
    `freshness` is the cluster's rule for cited readings: a sensor interval that lets older readings count as
    fresh asks for more trust."""
    reasons: list[str] = []
    if announced.model != accepted.model:
        reasons.append(f"model changed ({accepted.model} -> {announced.model}; risk floors are per model)")
    for actuator in announced.actuators:
        before = accepted.actuator(actuator.id)
        if before is None:
            reasons.append(f"actuator {actuator.id} added ({actuator.action}, risk {actuator.risk})")
            continue
        reasons += [f"actuator {actuator.id}: {why}" for why in _actuator_widenings(before, actuator)]
    kept = {s.metric: s for s in accepted.sensors}
    for sensor in announced.sensors:
        old = kept.get(sensor.metric)
        why = freshness.widening(old.interval_s, sensor.interval_s) if old is not None else None
        if why is not None:
            reasons.append(f"sensor {sensor.metric}: {why}")
    return reasons + wording_changes(accepted, announced)


def _actuator_widenings(before: Actuator, after: Actuator) -> list[str]:
    reasons = []
    if risk_rank(after.risk) < risk_rank(before.risk):
        reasons.append(f"risk lowered ({before.risk} -> {after.risk})")
    if after.level != before.level and after.level == "write":
        reasons.append(f"level lowered ({before.level} -> {after.level}: fewer people may set it)")
    if (after.action, after.type) != (before.action, before.type):
        reasons.append(f"action changed ({before.action} {before.type} -> {after.action} {after.type})")
    if before.range is not None and after.range is not None and (
            after.range.min < before.range.min or after.range.max > before.range.max):
        reasons.append(f"range widened ({before.range.min:g}..{before.range.max:g} -> "
                       f"{after.range.min:g}..{after.range.max:g})")
    added = sorted(set(after.values or []) - set(before.values or []))
    if added:
        reasons.append(f"values added ({', '.join(added)})")
    if after.step != before.step and not _coarser(before.step, after.step):
        reasons.append(f"step changed ({before.step} -> {after.step})")
    if after.unit != before.unit:
        reasons.append(f"unit changed ({before.unit or '-'} -> {after.unit or '-'})")
    reasons += limit_widenings(before, after)
    # Words (name, description) are judged with the contract's other words (contract.diff.wording_changes).
    known = {"risk", "level", "action", "type", "range", "values", "step", "unit", "id", "name", "description",
             "max_on_seconds", "hold_required"}
    old, new = before.model_dump(exclude_none=True), after.model_dump(exclude_none=True)
    for name in sorted((old.keys() | new.keys()) - known):
        if old.get(name) != new.get(name):
            reasons.append(f"{name} changed")  # e.g. a failsafe: whatever else acts on the device needs a person
    return reasons


def _coarser(before: float | None, after: float | None) -> bool:
    """A step that only allows fewer values: a whole multiple of the old one (or a first step)."""
    if after is None:
        return before is None
    if before is None:
        return True
    ratio = after / before
    return ratio >= 1 and abs(ratio - round(ratio)) < 1e-9


def replayed(accepted: Contract, announced: Contract) -> str | None:
    """Why a signed contract is refused as older than the accepted one, or None."""
    if accepted.version is None or announced.version is None or announced.version >= accepted.version:
        return None
    return (f"contract version {announced.version} is older than the accepted version {accepted.version}: "
            "a replayed or downgraded contract is refused")


@dataclass(frozen=True)
class Acceptance:
    """What the controller trusts of a device after it announced a contract."""

    accepted: str | None  # the Capability it trusts (None: nothing, the contract is refused)
    hold: tuple[str, ...] = ()  # why the announced contract waits for a person; empty: not held
    refused: str | None = None  # why the announced contract is refused outright
    # The condition's reason while held: a change to judge, or an accepted contract that is gone (deleted by
    # hand, or collected), so there is nothing to judge the announced one against.
    hold_reason: str = "ChangeNeedsAcceptance"


BRIDGED_MISMATCH = "BridgedContractNotAccepted"


def with_risk(contract: Contract, overrides: Mapping[str, Risk] | None) -> Contract:
    """A bridged contract with a person's risk per actuator (Device spec.bridge.risk) in place of the bridge's
    mapping: what the bridge announces and what `acceptedContractHash` is the hash of. Overrides naming no actuator
    of the contract are ignored (the actuator may come back later; the override then applies to it)."""
    if not overrides:
        return contract
    actuators = [a.model_copy(update={"risk": overrides[a.id]}) if a.id in overrides else a for a in contract.actuators]
    return contract.model_copy(update={"actuators": actuators})


def first_bridged(announced: Contract, announced_name: str, accepted_hash: str,
                  person_accepts: str | None) -> Acceptance:
    """The first contract a bridged Device binds: unsigned (no firmware of ours can sign it), so it binds only if it
    is the one a person accepted (`spec.bridge.acceptedContractHash`, recorded by `corral devices
    accept-discovered`), or a person accepted this very Capability since (`corral devices accept-contract`)."""
    if capability_hash(announced) == accepted_hash or person_accepts == announced_name:
        return Acceptance(announced_name)
    return Acceptance(None, hold=(f"the bridged contract (Capability {announced_name}) is not the one a person accepted "
                                  f"(content hash {accepted_hash[:16]}...): the discovered device changed after it was "
                                  "accepted, or something else announced on its topic",),
                      hold_reason=BRIDGED_MISMATCH)


def judge(announced: Contract, announced_name: str, accepted: Contract | None, accepted_name: str | None,
          person_accepts: str | None, check_versions: bool, freshness: FreshnessRule = DEFAULT_RULE,
          bridged_hash: str | None = None) -> Acceptance:
    """The announced contract against the accepted one (the Capability `accepted_name`, `accepted` its contract,
    None if that Capability is gone) and a person's acceptance (`spec.acceptCapability`). `bridged_hash`: the
    Device is bridged, and this is the content hash a person accepted (its first contract must have it)."""
    if accepted_name is None and bridged_hash is not None:
        return first_bridged(announced, announced_name, bridged_hash, person_accepts)
    if accepted_name is None or announced_name == accepted_name:
        return Acceptance(announced_name)  # the first contract after enrollment, or the same one
    if accepted is not None and check_versions:
        older = replayed(accepted, announced)
        if older is not None:
            return Acceptance(accepted_name, refused=older)
    if person_accepts == announced_name:
        return Acceptance(announced_name)
    if accepted is None:
        return Acceptance(accepted_name, hold=(f"the accepted contract (Capability {accepted_name}) is gone, so the "
                                               "announced one cannot be compared with it",),
                          hold_reason="AcceptedContractGone")
    reasons = widenings(accepted, announced, freshness)
    return Acceptance(accepted_name, hold=tuple(reasons)) if reasons else Acceptance(announced_name)
