"""The chart tests' NetworkPolicy reader (tests/network_policy.py) decides as the Kubernetes API defines."""

from __future__ import annotations

from typing import Any

from tests.network_policy import Source, Target, admits, selects

WEB = {"app": "web"}


def policy(ingress: list[dict[str, Any]], namespace: str = "home", selector: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace},
            "spec": {"podSelector": selector if selector is not None else {"matchLabels": WEB},
                     "policyTypes": ["Ingress"], "ingress": ingress}}


def test_a_pod_no_policy_selects_is_open_and_one_selected_is_closed_but_for_its_rules() -> None:
    pod, lan = Target("home", WEB, 80), Source("192.168.1.5")
    assert admits([], lan, pod)
    assert admits([policy([], selector={"matchLabels": {"app": "db"}})], lan, pod)
    assert not admits([policy([])], lan, pod)
    assert admits([policy([{"ports": [{"port": 80, "protocol": "TCP"}]}])], lan, pod)
    assert not admits([policy([{"ports": [{"port": 81, "protocol": "TCP"}]}])], lan, pod)


def test_an_ip_block_admits_its_addresses_but_its_exceptions() -> None:
    rules = [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.42.0.0/16"]}}]}]
    pod = Target("home", WEB, 80)
    assert admits([policy(rules)], Source("192.168.1.5"), pod)
    assert not admits([policy(rules)], Source("10.42.3.4", "other"), pod)
    assert not admits([policy(rules)], Source("fd00::1"), pod), "an IPv4 block says nothing of IPv6"


def test_a_pod_selector_alone_means_the_policy_namespace_and_a_namespace_selector_others() -> None:
    same = [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]
    pod = Target("home", WEB, 80)
    assert admits([policy(same)], Source("10.42.0.2", "home", {"role": "client"}), pod)
    assert not admits([policy(same)], Source("10.42.0.3", "away", {"role": "client"}), pod)
    assert not admits([policy(same)], Source("192.168.1.5"), pod), "selectors name Pods, not LAN clients"
    other = [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}]
    assert admits([policy(other)], Source("10.42.0.4", "away", {}, {"team": "ops"}), pod)
    assert not admits([policy(other)], Source("10.42.0.5", "away", {}, {"team": "dev"}), pod)


def test_selectors_match_labels_and_expressions() -> None:
    assert selects({}, {"a": "1"}) and selects(None, {})
    assert selects({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"})
    assert not selects({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"})
    assert selects({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}, {"a": "1"})
    assert not selects({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"})
