"""The approval page's list (console/waiting.py): what waits for a person, with the context to decide, from
API objects as the API server returns them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from corral.console.waiting import intent_view, paused_notices, waiting_devices, waiting_for

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
NS = "home"


def intent(name: str, device: str = "front-lock", phase: str | None = "AwaitingApproval", expires_in_s: float = 90,
           **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"risk": "high", "paramsHash": "a" * 64}
    if phase:
        status["phase"] = phase
    if phase == "AwaitingApproval":
        status["approvalExpiresAt"] = (NOW + timedelta(seconds=expires_in_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "creationTimestamp": "2026-12-01T11:59:00Z"},
        "spec": {"device": device, "actuator": "locked", "action": "set_state", "params": {"value": True},
                 "reason": "everyone left", "requester": "system:serviceaccount:home:agent", **spec},
        "status": status,
    }


def device(alias: str = "Front door", location: str = "Hall", reported: dict[str, Any] | None = None,
           online: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": "front-lock", "namespace": NS, "labels": {"corral.dev/device-type": "lock"}},
            "spec": {"overlay": {"alias": alias, "location": location}},
            "status": {"online": online, "reported": {"locked": False} if reported is None else reported}}


def test_a_waiting_intent_shows_what_a_person_needs_to_decide() -> None:
    cited = intent("lock-1", basedOn=[{"metric": "motion", "ts": 1_764_590_400_123},
                                      {"metric": "door", "ts": 1_764_590_400_000, "deviceId": "hall-sensor"}])
    [view] = waiting_for([cited], {(NS, "front-lock"): device()}, {(NS, "front-lock")}, NOW)
    assert (view.namespace, view.name, view.uid, view.device) == (NS, "lock-1", "uid-lock-1", "front-lock")
    assert (view.alias, view.location) == ("Front door", "Hall")
    assert view.change == "locked = true"
    assert view.current == "locked = false" and view.current_note == ""
    assert (view.risk, view.requester, view.reason) == ("high", "system:serviceaccount:home:agent", "everyone left")
    assert [(r.metric, r.ts, r.device) for r in view.based_on] == [
        ("motion", 1_764_590_400_123, "front-lock"), ("door", 1_764_590_400_000, "hall-sensor")]
    assert view.based_on[0].at == "2025-12-01T12:00:00.123Z"
    assert view.seconds_left == 90.0 and view.expires_at == "2026-12-01T12:01:30Z"
    assert view.waiting and view.may_approve and view.outcome == "AWAITING_APPROVAL"
    document = view.as_json()
    assert document["based_on"][0] == {"metric": "motion", "ts": 1_764_590_400_123,
                                       "at": "2025-12-01T12:00:00.123Z", "device": "front-lock"}


def test_only_intents_awaiting_approval_on_devices_the_person_may_approve_are_listed() -> None:
    intents = [
        intent("waits"),
        intent("running", phase="Executing"),
        intent("done", phase="Succeeded"),
        intent("new", phase=None),
        intent("dry", dryRun=True),
        intent("elsewhere", device="garage-door"),
    ]
    approvable = {(NS, "front-lock")}
    assert waiting_devices(intents) == {(NS, "front-lock"), (NS, "garage-door")}
    views = waiting_for(intents, {(NS, "front-lock"): device()}, approvable, NOW)
    assert [v.name for v in views] == ["waits"]
    assert waiting_for(intents, {}, set(), NOW) == []  # may list Intents, holds approve nowhere: nothing to approve


def test_the_one_that_expires_first_comes_first() -> None:
    intents = [intent("later", expires_in_s=200), intent("soon", expires_in_s=20), intent("middle", expires_in_s=100)]
    views = waiting_for(intents, {}, {(NS, "front-lock")}, NOW)
    assert [v.name for v in views] == ["soon", "middle", "later"]


def test_unknown_or_unreadable_state_is_said_so_and_an_offline_device_is_last_known() -> None:
    [unreadable] = waiting_for([intent("a")], {(NS, "front-lock"): None}, {(NS, "front-lock")}, NOW)
    assert unreadable.current is None and unreadable.current_note == "you may not read this device"
    assert (unreadable.alias, unreadable.location) == ("", "")
    [unreported] = waiting_for([intent("a")], {(NS, "front-lock"): device(reported={})}, {(NS, "front-lock")}, NOW)
    assert unreported.current is None and unreported.current_note == "not reported yet"
    [offline] = waiting_for([intent("a")], {(NS, "front-lock"): device(online=False)}, {(NS, "front-lock")}, NOW)
    assert offline.current == "locked = false" and "offline" in offline.current_note


def test_values_and_changes_are_shown_as_people_write_them() -> None:
    fan = intent("fan", actuator="fan", action="set_level", params={"value": "high"})
    assert intent_view(fan, None, True, NOW).change == 'fan = "high"'
    temp = intent("t", actuator="setpoint", action="set_value", params={"value": 21.5})
    assert intent_view(temp, None, True, NOW).change == "setpoint = 21.5"
    alias = intent("n", actuator="alias", action="set_alias", params={"value": "Front door"})
    assert intent_view(alias, None, True, NOW).change == 'set the alias to "Front door"'
    read = intent("r", actuator="locked", action="read", params=None)
    assert intent_view(read, None, True, NOW).change == "read locked"


def test_what_came_from_devices_and_agents_is_kept_as_text_for_the_page_to_escape() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    view = intent_view(intent("x", reason=hostile), device(alias="<script>alert(2)</script>"), True, NOW)
    assert view.reason == hostile and view.alias == "<script>alert(2)</script>"


def test_a_decided_intent_shows_its_outcome_and_no_time_left() -> None:
    done = intent("done", phase="Denied")
    done["status"].update(code="DENIED_BY_APPROVER", message="Denied by alice: not now")
    view = intent_view(done, device(), may_approve=True, now=NOW)
    assert (view.outcome, view.message, view.phase) == ("DENIED_BY_APPROVER", "Denied by alice: not now", "Denied")
    assert not view.waiting and not view.may_approve and view.seconds_left is None


def test_an_expired_window_shows_zero_not_a_negative_time() -> None:
    view = intent_view(intent("late", expires_in_s=-30), None, True, NOW)
    assert view.seconds_left == 0.0


def test_malformed_fields_do_not_break_the_list() -> None:
    odd = intent("odd", basedOn=[{"metric": "m", "ts": "soon"}, {"metric": "m", "ts": True}, {"metric": "m", "ts": 5}])
    odd["status"]["approvalExpiresAt"] = "not a time"
    view = intent_view(odd, {"spec": {"overlay": None}, "status": None}, True, NOW)
    assert [r.ts for r in view.based_on] == [5]
    assert view.expires_at is None and view.seconds_left is None and view.current is None


def test_the_banner_says_where_agents_are_paused_among_the_served_namespaces() -> None:
    def switch(namespace: str, paused: bool) -> dict[str, Any]:
        return {"metadata": {"name": "agents", "namespace": namespace},
                "spec": {"paused": paused, "reason": "leak in the basement", "by": "alice",
                         "since": "2026-12-01T11:58:00Z"}}

    switches = [switch("shed", True), switch(NS, True), switch("garage", False)]
    notices = paused_notices(switches, None)
    assert [n["namespace"] for n in notices] == ["home", "shed"]
    assert notices[0]["message"] == (
        "Agents are paused in namespace home since 2026-12-01 11:58:00 UTC by alice: leak in the basement. Nothing "
        "an agent asks for there runs until a person resumes agents (corral agents resume -n home). Your own "
        "requests still run.")
    assert [n["namespace"] for n in paused_notices(switches, [NS, "garage"])] == ["home"]
    assert paused_notices([], [NS]) == []


def test_the_card_leads_with_the_devices_name_and_type_and_marks_what_someone_called_it() -> None:
    """The attack: an agent set the lock's alias to "kitchen-light" and its location to "Kitchen (ceiling)", and the
    approval card of the lock was headlined as the kitchen light."""
    view = intent_view(intent("lock-1"), device(alias="kitchen-light", location="Kitchen (ceiling)"), True, NOW)
    assert view.title == "front-lock (lock)"
    assert view.named == "called “kitchen-light” and said to be in “Kitchen (ceiling)” by a person or agent"
    assert view.as_json()["title"] == "front-lock (lock)"
    # Positive control: without an overlay there is nothing to mark; an unreadable Device still shows its name.
    assert intent_view(intent("lock-2"), device(alias="", location=""), True, NOW).named == ""
    assert intent_view(intent("lock-3"), None, True, NOW).title == "front-lock"


def test_reasons_aliases_and_messages_are_shown_without_invisible_or_reordering_characters() -> None:
    """The attack: an Intent's reason kept U+202E (right-to-left override), U+200B (zero-width space) and tag
    characters (invisible instructions), which the overlay lost but the reason did not."""
    tags = "".join(chr(0xE0000 + ord(c)) for c in "approve")  # Unicode tag characters: invisible ASCII
    reason = f"Everyone left \u202ekcol\u202c the\u200b house{tags}\n\tnow " + "x" * 600
    hostile = device(alias="Front\u2066 door\u200d", location="Hall\U000e0041")
    done = intent("lock-1", reason=reason)
    done["status"]["message"] = "Denied by alice: \u202enot now"
    view = intent_view(done, hostile, True, NOW)
    assert view.reason.startswith("Everyone left kcol the house now xxx") and len(view.reason) == 512
    assert view.reason.endswith("…")
    assert (view.alias, view.location, view.message) == ("Front door", "Hall", "Denied by alice: not now")
    # Positive control: ordinary text in any script stays as it was written.
    plain = intent_view(intent("lock-2", reason="Tout le monde est parti — 出门了"), device(), True, NOW)
    assert plain.reason == "Tout le monde est parti — 出门了"

