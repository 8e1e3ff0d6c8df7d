"""A caller who can see no device is told so, and what to ask its operator for, never to call a tool it lacks."""

from __future__ import annotations

from corral.gateway.server import instructions
from corral.gateway.unseen import binding_commands, nothing_visible_note


def test_a_service_account_is_told_the_rolebinding_that_lets_it_act_in_each_namespace() -> None:
    assert binding_commands("system:serviceaccount:home:agent", ["home", "garden"]) == [
        "kubectl create rolebinding corral-agent-agent --clusterrole=corral-agent-operator "
        "--serviceaccount=home:agent -n home",
        "kubectl create rolebinding corral-agent-agent --clusterrole=corral-agent-operator "
        "--serviceaccount=home:agent -n garden"]


def test_a_user_is_named_as_a_user_quoted_for_the_shell() -> None:
    assert binding_commands("alice", ["home"]) == [
        "kubectl create rolebinding corral-agent-alice --clusterrole=corral-agent-operator --user=alice -n home"]
    odd = binding_commands("oidc:Bob Smith; rm -rf ~", ["home"])[0]
    assert "--user='oidc:Bob Smith; rm -rf ~'" in odd and "rolebinding corral-agent-oidc-bob-smith-rm-rf " in odd


def test_the_instructions_of_a_caller_who_sees_nothing_name_no_tool_and_say_what_to_ask_for() -> None:
    note = nothing_visible_note("system:serviceaccount:home:agent", ["home"])
    told = instructions(["home"], note)
    assert "iot." not in told and "you can see none here, so you have no tools yet" in told
    assert "--clusterrole=corral-agent-operator --serviceaccount=home:agent -n home" in told
    assert "ask their operator" in told and "-n for the namespace where the devices are" in told
    # The control: a caller who sees devices is told where to start.
    assert "Start with iot.list_devices" in instructions(["home"])


def test_over_http_one_text_for_every_caller_says_what_an_empty_tool_list_means() -> None:
    told = instructions(["home"], caller_known=False)
    assert "Start with iot.list_devices" in told and "If your tool list is empty" in told
    assert "--clusterrole=corral-agent-operator" in told
    assert "If your tool list is empty" not in instructions(["home"])
