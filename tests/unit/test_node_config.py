"""The node's configuration and its clean-up, without a node: what each part is told, and what `down` removes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from corral.client.pki import new_ca
from corral.devcluster import nodeaddons, nodeclean, nodeconfig, nodehost, nodepki
from corral.devcluster.errors import DevClusterError

LAYOUT = nodeconfig.NodeLayout(Path("/state/node"))


def test_containerd_keeps_everything_in_the_node_directory_and_never_lowers_oom_scores() -> None:
    config = tomllib.loads(nodeconfig.containerd_config(LAYOUT))
    assert config["version"] == 2
    assert config["root"].startswith("/state/node/") and config["state"].startswith("/state/node/")
    assert config["grpc"]["address"] == "/state/node/containerd/containerd.sock"
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # without CAP_SYS_RESOURCE runc fails every container otherwise
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["sandbox_image"] == "corral.local/pause:3.10"
    options = cri["containerd"]["runtimes"]["runc"]["options"]
    assert options == {"BinaryName": "/usr/sbin/runc", "Root": "/state/node/containerd/runc", "SystemdCgroup": False}
    assert cri["cni"]["conf_dir"] == "/state/node/cni/net.d"


def test_the_pod_network_is_a_masquerading_bridge_with_its_leases_in_the_node_directory() -> None:
    network = json.loads(nodeconfig.cni_conflist(LAYOUT))
    bridge, portmap = network["plugins"]
    assert (bridge["bridge"], bridge["isGateway"], bridge["ipMasq"], bridge["hairpinMode"]) == ("cni0", True, True, True)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.42.0.0/24"}]]
    assert bridge["ipam"]["dataDir"] == "/state/node/cni/networks"
    assert portmap["type"] == "portmap"


def test_the_kubelet_runs_on_cgroup_v1_with_cgroupfs_and_lets_nobody_in_anonymously() -> None:
    config = yaml.safe_load(nodeconfig.kubelet_config(LAYOUT, Path("/ca"), Path("/crt"), Path("/key")))
    assert (config["cgroupDriver"], config["failCgroupV1"]) == ("cgroupfs", False)
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["readOnlyPort"] == 0
    assert config["clusterDNS"] == ["10.96.0.10"]
    assert config["containerRuntimeEndpoint"] == "unix:///state/node/containerd/containerd.sock"
    for key in ("podLogsDir", "staticPodPath", "volumePluginDir"):
        assert config[key].startswith("/state/node/"), key


def test_a_node_plane_s_api_server_authorizes_nodes_instead_of_adding_a_second_mode() -> None:
    assert nodeconfig.authorization_mode(True) == "--authorization-mode=Node,RBAC"
    assert nodeconfig.authorization_mode(False) == "--authorization-mode=RBAC"
    flags = nodeconfig.apiserver_node_flags("192.0.2.2", nodeconfig.ApiserverNodeFiles(Path("c"), Path("k"), Path("a")))
    assert "--advertise-address=192.0.2.2" in flags and "--bind-address=0.0.0.0" in flags
    assert "--enable-admission-plugins=NodeRestriction" in flags


def test_a_resolver_only_this_machine_reaches_is_found() -> None:
    assert nodeconfig.loopback_nameservers("nameserver 127.0.0.53\nnameserver 10.0.0.1\n") == ["127.0.0.53"]
    assert nodeconfig.loopback_nameservers("# nameserver 127.0.0.1\nnameserver 10.255.255.53\n") == []


def test_component_certificates_carry_the_identities_kubernetes_authorizes() -> None:
    ca = new_ca("test")
    kubelet = x509.load_pem_x509_certificate(nodepki.issue_client(ca, nodepki.kubelet_identity("vm")).cert_pem)
    assert kubelet.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:vm"
    assert kubelet.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    serving = x509.load_pem_x509_certificate(nodepki.issue_server(ca, "vm", ("192.0.2.2", "vm")).cert_pem)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["192.0.2.2"]
    assert names.get_values_for_type(x509.DNSName) == ["vm"]


def test_the_default_storage_class_waits_for_the_pod_as_k3s_s_does() -> None:
    classes = [m for m in nodeaddons.local_path("p:1", "b:1", "/s") if m["kind"] == "StorageClass"]
    assert len(classes) == 1
    storage_class = classes[0]
    assert storage_class["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"


def test_cluster_dns_is_served_at_the_address_the_kubelet_gives_pods_and_images_are_never_pulled() -> None:
    manifests = nodeaddons.coredns("corral.local/coredns:x")
    service = next(m for m in manifests if m["kind"] == "Service")
    assert service["spec"]["clusterIP"] == nodeconfig.CLUSTER_DNS
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["imagePullPolicy"] == "Never"
    corefile = next(m for m in manifests if m["kind"] == "ConfigMap")["data"]["Corefile"]
    assert "forward . /etc/resolv.conf" in corefile and "kubernetes cluster.local" in corefile


SAVED = """\
# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:NETAVARK-1D8721804F16F DROP [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:CNI-6f0e2a1c9f2b - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.42.0.2/32 -m comment --comment "name: \\"corral\\" id: \\"abc\\"" -j CNI-6f0e2a1c9f2b
-A POSTROUTING -s 10.88.0.0/16 -j NETAVARK-1D8721804F16F
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-NPX46M4PTMTKRN6Y
-A CNI-6f0e2a1c9f2b -d 10.42.0.0/24 -j ACCEPT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
-A FORWARD -j ACCEPT
COMMIT
"""


def test_down_removes_our_chains_and_the_rules_jumping_into_them_and_nothing_else() -> None:
    script = nodeclean.iptables_restore_script(SAVED)
    lines = script.splitlines()
    assert lines[0] == "*nat" and lines[-1] == "COMMIT"
    assert "*filter" not in lines  # nothing of ours there: the table is left alone
    deletes = [line for line in lines if line.startswith("-D ")]
    assert len(deletes) == 3
    assert all("NETAVARK" not in line for line in lines)  # another tool's chain and rule stay
    assert {line for line in lines if line.startswith("-X ")} == {
        "-X KUBE-SERVICES", "-X KUBE-POSTROUTING", "-X CNI-6f0e2a1c9f2b"}
    # Flushed before any is deleted: a chain still referenced by another of ours cannot be deleted.
    assert max(i for i, line in enumerate(lines) if line.startswith("-F ")) < \
        min(i for i, line in enumerate(lines) if line.startswith("-X "))
    assert nodeclean.iptables_restore_script("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n") == ""


def test_down_destroys_kube_router_s_ipsets_only() -> None:
    assert nodeclean.ipsets_to_destroy(["KUBE-DST-ABC", "kube-router-local-ips", "inet6:KUBE-SRC-X", "mine"]) == [
        "KUBE-DST-ABC", "kube-router-local-ips", "inet6:KUBE-SRC-X"]


def test_mounts_under_the_node_are_unmounted_deepest_first() -> None:
    mountinfo = (
        "20 1 8:1 / / rw - ext4 /dev/vda rw\n"
        "30 20 0:5 / /state/node/kubelet rw shared:1 - ext4 /dev/vda rw\n"
        "31 30 0:6 / /state/node/kubelet/pods/u/volumes/kubernetes.io~projected/kube\\040api rw - tmpfs tmpfs rw\n"
        "32 20 0:7 / /state/node-other rw - tmpfs tmpfs rw\n"
    )
    assert nodeclean.mounts_under(mountinfo, [Path("/state/node/kubelet")]) == [
        "/state/node/kubelet/pods/u/volumes/kubernetes.io~projected/kube api", "/state/node/kubelet"]


def test_a_node_asked_for_without_root_is_refused_saying_why_and_what_works_instead(monkeypatch) -> None:
    monkeypatch.setattr(nodehost.os, "geteuid", lambda: 1000)
    with pytest.raises(DevClusterError) as refused:
        nodehost.require_root()
    assert "needs root" in str(refused.value) and "uid 1000" in str(refused.value)
    assert "`corral dev up` without --node" in str(refused.value)
