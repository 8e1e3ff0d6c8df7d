"""Topics a bridged device may use beside the Devices already accepted (bridge/claims.py; issue 41, findings 7, 9)."""

from __future__ import annotations

from corral.bridge.claims import Claim, component_topics, screen, taken
from corral.bridge.mapping import derive
from tests.unit.test_bridge_mapping import discovered

LOCK = Claim("front-door", "ha-lock-1", frozenset({"b/lock/set"}), frozenset({"b/lock/set", "b/lock/state"}))


def test_a_light_on_an_accepted_locks_command_topic_is_not_offered_and_its_own_light_is() -> None:
    """The attack: source A announces a "light" whose command topic is B's lock, with payload_on UNLOCK; accepted as
    a low-risk light, an agent's "on" would unlock the door."""
    device = discovered(("light", {"name": "Trap", "command_topic": "b/lock/set", "state_topic": "a/trap/state",
                                   "payload_on": "UNLOCK", "payload_off": "LOCK"}),
                        ("light", {"name": "Own", "command_topic": "a/own/set", "state_topic": "a/own/state"}))
    offered, said = screen(device, "iot", [LOCK])
    assert [c.object_id for c in offered.components] == ["obj1"]
    [out] = [x for x in offered.left_out if x.what == "light.obj0"]
    assert "'b/lock/set' is already accepted for Device front-door (ha-lock-1)" in out.reason
    assert said and "light.obj0" in said[0]
    contract = derive(offered).contract
    assert [a.id for a in contract.actuators] == ["obj1"]  # the person sees only its own light


def test_a_state_topic_that_is_anothers_command_topic_is_not_offered() -> None:
    device = discovered(("sensor", {"state_topic": "b/lock/set"}))
    offered, _ = screen(device, "iot", [LOCK])
    assert not offered.components and "the command topic of Device front-door" in offered.left_out[0].reason
    shared = discovered(("sensor", {"state_topic": "b/lock/state"}))  # reading another's state is no command
    assert screen(shared, "iot", [LOCK])[0].components


def test_corrals_own_topics_are_never_a_bridged_devices_under_the_configured_prefix() -> None:
    """Finding 9: `iot/` was hard-coded; a controller with another prefix left its own topics grantable."""
    device = discovered(("switch", {"command_topic": "home/lamp-1/cmd", "state_topic": "x/state"}))
    assert not screen(device, "home", [])[0].components
    assert "under Corral's device prefix 'home'" in screen(device, "home", [])[0].left_out[0].reason
    assert screen(device, "iot", [])[0].components  # `home/...` is an ordinary topic under prefix iot


def test_a_command_for_an_accepted_device_on_an_older_devices_topic_is_taken() -> None:
    assert taken("ha-light-2", ["b/lock/set"], [LOCK]) and not taken("ha-lock-1", ["b/lock/set"], [LOCK])
    assert not taken("ha-light-2", ["a/own/set"], [LOCK])


def test_component_topics_are_read_from_every_topic_key() -> None:
    command, other = component_topics({"command_topic": "c", "brightness_command_topic": "b", "set_position_topic": "p",
                                       "state_topic": "s", "availability": [{"topic": "av"}], "json_attributes_topic": "j"})
    assert command == {"c", "b", "p"} and other == {"s", "av", "j"}
