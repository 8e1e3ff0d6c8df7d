"""`corral demo --node`'s pure parts: the helm command it runs (the chart README's), what it takes over on a plane
`corral demo` used before, its progress while helm waits, and the message a person reads when it is ready."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from corral.cli.demo import _node_instructions
from corral.devcluster.nodedemo import (
    NodeReady,
    chart_dir,
    foreign_objects,
    helm_install_args,
    image_values,
    pods_summary,
)
from tests.chart_readme import k3s_install_commands

IMAGES = {"corral": "corral.local/corral:0.1.0-65fac7b044b6", "mosquitto": "corral.local/mosquitto:9bd46d9be9e4"}


def _options(argv: list[str]) -> list[tuple[str, str]]:
    """(option, value) pairs of a helm command line, e.g. ("--set", "nodeAddress=10.0.0.5")."""
    pairs, i = [], 0
    while i < len(argv):
        if argv[i].startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            pairs.append((argv[i], argv[i + 1]))
            i += 2
        else:
            pairs.append((argv[i], ""))
            i += 1
    return pairs


def test_the_demo_installs_with_every_option_of_the_chart_readmes_helm_install() -> None:
    readme = next(c for c in k3s_install_commands("10.0.0.5", image_values(IMAGES)) if c.startswith("helm install"))
    words = [w.replace("$NODE", "10.0.0.5") for w in shlex.split(readme)]
    assert words[:4] == ["helm", "install", "corral", "charts/corral"], readme
    ours = helm_install_args(chart_dir(), "10.0.0.5", IMAGES)
    assert ours[:4] == ["upgrade", "--install", "corral", str(chart_dir())]
    theirs = [(o, v.replace("charts/corral/", f"{chart_dir()}/")) for o, v in _options(words[4:])]
    missing = [pair for pair in theirs if pair not in _options(ours[4:])]
    assert not missing, f"the README's helm install has options the demo's lacks: {missing}\nours: {ours}"


def test_the_images_built_here_are_named_with_a_pull_policy_that_never_pulls() -> None:
    assert image_values(IMAGES) == [
        "image.repository=corral.local/corral", "image.tag=0.1.0-65fac7b044b6", "image.pullPolicy=Never",
        "mosquitto.image.repository=corral.local/mosquitto", "mosquitto.image.tag=9bd46d9be9e4",
        "mosquitto.image.pullPolicy=Never"]


def _object(kind: str, name: str, release: str | None = None, namespace: str = "corral") -> dict:
    annotations = ({"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}
                   if release else {})
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "annotations": annotations}}


def test_objects_made_without_helm_are_taken_over_and_another_releases_are_refused() -> None:
    adopt, conflicts = foreign_objects([
        _object("ClusterRole", "corral-agent-operator"),  # `corral demo` applied it
        _object("ClusterRole", "corral-approver", release="corral"),  # the release's own already
        _object("ValidatingAdmissionPolicy", "corral-intent-requester", release="other", namespace="prod"),
        _object("Namespace", "corral-people"),  # the chart uses a kept people namespace as it is
    ])
    assert [a["metadata"]["name"] for a in adopt] == ["corral-agent-operator"]
    assert conflicts == ["ValidatingAdmissionPolicy corral-intent-requester (helm release other in namespace prod)"]


def test_while_helm_waits_the_person_sees_ready_pods_by_component_and_why_one_is_not() -> None:
    def pod(component: str, ready: bool, waiting: str | None = None) -> dict:
        return {"metadata": {"labels": {"app.kubernetes.io/component": component}},
                "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                           "containerStatuses": [{"state": {"waiting": {"reason": waiting}} if waiting else {}}]}}

    assert pods_summary([]) == "no Pods yet"
    assert pods_summary([pod("gateway", False, "ContainerCreating"), pod("controller", True)]) == \
        "controller 1/1, gateway 0/1 (ContainerCreating)"


@pytest.mark.parametrize("own_node", [True, False])
def test_the_ready_message_says_where_to_connect_through_the_nodes_ports(tmp_path: Path, own_node: bool) -> None:
    ready = NodeReady(kubeconfig=tmp_path / "kubeconfig", node_name="box", node_ip="10.0.0.5", namespace="corral",
                      devices=43, agent_token=tmp_path / "node-agent-token", person="alice",
                      person_token=tmp_path / "alice-token", broker_ca=tmp_path / "node-broker-ca.crt",
                      helm=tmp_path / "helm", own_node=own_node)
    text = _node_instructions(ready)
    assert f"source {tmp_path / 'env'} && kubectl" in text
    assert "http://10.0.0.5:30800/mcp" in text and f"Bearer $(cat {tmp_path / 'node-agent-token'})" in text
    assert "http://10.0.0.5:30880/" in text and str(tmp_path / "alice-token") in text
    assert "mqtts://10.0.0.5:30883" in text and str(tmp_path / "node-broker-ca.crt") in text
    assert ("node was running before and stays up" in text) is not own_node
    for command in re.findall(r"(\S*corral) (?:intents|approve)\b", text):
        assert command != "corral", f"a bare corral is not on the env file's PATH: {text}"
