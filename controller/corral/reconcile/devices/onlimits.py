"""After an on-time limit: what people are told, and why the controller does not switch the actuator on again.

The firmware switches an actuator off once it has been on for its contract's `max_on_seconds`, controller or not,
and reports it (`max_on` in its state event and acks; docs/protocol.md, "On-time limits"). The target usually
still says on. Driving it again like any drift would undo the limit, so an actuator the device reports switched
off by its limit, whose target is an on value, is left off: only an Intent's own command (a new request, judged
like any other) switches it on again, and that clears the device's report. Apart from the reconciler like
`failsafes`: one rule with its own words, read by the plan, the Events and the condition.
"""

from __future__ import annotations

from corral.api.device import Device
from corral.contract.values import same_value
from corral.reconcile.devices.notices import DeviceNotices, as_json
from corral.reconcile.devices.runtime import DeviceRuntime


class OnTimeLimits:
    def __init__(self, notices: DeviceNotices) -> None:
        self.notices = notices

    def limited(self, rt: DeviceRuntime, device: Device) -> frozenset[str]:
        """Actuators the limit switched off whose target is on: not driven (an Intent's pinned command still is)."""
        if rt.contract is None or not rt.max_on:
            return frozenset()
        target = device.spec.target
        left = set()
        for actuator_id, report in rt.max_on.items():
            actuator = rt.contract.actuator(actuator_id)
            if actuator is None or report.error is not None or actuator_id not in target:
                continue
            if actuator.is_on(target[actuator_id]) and same_value(rt.reported.get(actuator_id), actuator.off_value()):
                left.add(actuator_id)
        return frozenset(left)

    def announce(self, rt: DeviceRuntime, device: Device) -> None:
        """A Warning Event and an audit record per limit the device reported (once per report)."""
        for actuator, report in sorted(rt.max_on.items()):
            self.notices.once(rt, device, f"max-on/{actuator}/{report.ts}", "OnTimeLimit", "Observe",
                              f"The device switched {report.cause(actuator)} by itself.", "Warning",
                              fact=("device.max_on", {"actuator": actuator,
                                                      **report.model_dump(mode="json", exclude_none=True)}))

    def condition(self, rt: DeviceRuntime, device: Device) -> tuple[str, str] | None:
        """(reason, message) of condition OnTimeLimit while the device reports an actuator its limit switched off."""
        if not rt.max_on:
            return None
        target = device.spec.target
        limited = self.limited(rt, device)
        parts = []
        for actuator, report in sorted(rt.max_on.items()):
            if actuator in limited:
                then = (f"spec.target.{actuator}={as_json(target[actuator])} is not driven again by itself: ask for "
                        "it with an Intent to switch it on for another period.")
            elif report.error is not None:
                then = "it is still on; the device tries again."
            else:
                then = "its target does not ask for it on."
            parts.append(f"The device switched {report.cause(actuator)} by itself; {then}")
        failed = any(r.error is not None for r in rt.max_on.values())
        return ("LimitFailed" if failed else "LimitReached"), " ".join(parts)
