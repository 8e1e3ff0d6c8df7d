"""Issue 28's node, used as a k3s user uses theirs: DNS by Service name, the restricted Pod Security level, a PVC
on the default StorageClass, a killed container restarted by the kubelet, NetworkPolicy enforced.

All on the real node of `corral dev up --node` (tests/node_harness.py): Pods of the busybox image built here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from corral.devcluster.errors import DevClusterError
from corral.devcluster.node import DevNode, NodePlane
from tests.harness import wait_for
from tests.node_harness import apply, exec_in, get, kubectl, node_namespace, pod_manifest, wait_pod_ready

SLEEPER = ["sh", "-c", "exec sleep 3600"]
HTTP_SERVER = ["sh", "-c", "mkdir -p /tmp/www && echo served > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"]
TMP = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}


def test_a_pod_resolves_the_api_server_and_another_namespace_s_service_by_name(node_plane: NodePlane) -> None:
    node = node_plane
    with node_namespace(node, "dns-server") as served, node_namespace(node, "dns-client") as client:
        apply(node, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": served},
                     "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]}},
              pod_manifest(node, "echo", served, HTTP_SERVER, labels={"app": "echo"}, volumes=[TMP], mounts=[TMP_MOUNT]),
              pod_manifest(node, "client", client, SLEEPER))
        wait_pod_ready(node, "echo", served)
        wait_pod_ready(node, "client", client)
        api_ip = get(node, "service", "kubernetes", "default")["spec"]["clusterIP"]
        echo_ip = get(node, "service", "echo", served)["spec"]["clusterIP"]

        # busybox's nslookup asks for the name as given (no search list): the full names.
        answer = exec_in(node, "client", client, "nslookup", "kubernetes.default.svc.cluster.local").stdout
        assert api_ip in answer, answer
        answer = exec_in(node, "client", client, "nslookup", f"echo.{served}.svc.cluster.local").stdout
        assert echo_ip in answer, answer
        # The short name through the Pod's resolver (its search list), and it leads to the Service's Pod.
        assert _http_get(node, "client", client, f"echo.{served}", 80) == "served"


def test_a_pod_violating_restricted_is_refused_where_the_namespace_enforces_it(node_plane: NodePlane) -> None:
    node = node_plane
    with node_namespace(node, "restricted", labels={"pod-security.kubernetes.io/enforce": "restricted"}) as name:
        root_pod = pod_manifest(node, "as-root", name, SLEEPER, restricted=False)
        refused = kubectl(node, "apply", "-f", "-", stdin=json.dumps(root_pod), check=False)
        assert refused.returncode != 0
        assert 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
        # The same Pod made to comply is admitted and runs: the refusal was the policy, not the Pod.
        apply(node, pod_manifest(node, "complying", name, SLEEPER))
        wait_pod_ready(node, "complying", name)
        assert exec_in(node, "complying", name, "id", "-u").stdout.strip() == "10001"
        write = exec_in(node, "complying", name, "touch", "/written", check=False)
        assert write.returncode != 0 and "Read-only file system" in write.stderr, write


def test_a_claim_binds_through_the_default_storage_class_and_its_pod_writes_to_it(node_plane: NodePlane) -> None:
    node = node_plane
    with node_namespace(node, "storage") as name:
        apply(node,
              {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": name},
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}},
              pod_manifest(node, "writer", name, ["sh", "-c", "echo kept > /data/note && exec sleep 3600"],
                           volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                           mounts=[{"name": "data", "mountPath": "/data"}]))
        wait_pod_ready(node, "writer", name, timeout_s=90)
        claim = get(node, "pvc", "data", name)
        assert claim["status"]["phase"] == "Bound"
        assert claim["spec"]["storageClassName"] == "local-path"
        assert exec_in(node, "writer", name, "cat", "/data/note").stdout.strip() == "kept"
        # On this machine, where local-path keeps the volume.
        notes = list(node.storage_dir.glob(f"*_{name}_data/note"))
        assert [n.read_text().strip() for n in notes] == ["kept"], notes


def test_a_container_killed_with_sigkill_is_restarted_in_its_pod_by_the_kubelet(node_plane: NodePlane) -> None:
    node = node_plane
    with node_namespace(node, "restart") as name:
        apply(node, pod_manifest(node, "victim", name, SLEEPER))
        pod = wait_pod_ready(node, "victim", name)
        uid = pod["metadata"]["uid"]
        status = pod["status"]["containerStatuses"][0]
        assert status["restartCount"] == 0
        container_id = status["containerID"].removeprefix("containerd://")

        os.kill(_task_pid(node, container_id), signal.SIGKILL)

        def restarted() -> dict | None:
            now = get(node, "pod", "victim", name)
            state = now["status"]["containerStatuses"][0]
            return now if state["restartCount"] >= 1 and "running" in state["state"] else None
        after = wait_for(restarted, "the kubelet to restart the killed container", timeout_s=60, interval_s=0.3)
        assert after["metadata"]["uid"] == uid  # the same Pod, a new container
        assert after["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://") != container_id


def test_a_default_deny_policy_closes_a_pod_s_port_to_another_namespace_until_allowed(node_plane: NodePlane) -> None:
    node = node_plane
    if "kube-router" not in node.policy_enforcer:
        pytest.skip(f"NetworkPolicy is not enforced on this node: {node.policy_enforcer}")
    with node_namespace(node, "np-server") as served, node_namespace(node, "np-client") as client:
        apply(node, pod_manifest(node, "server", served, HTTP_SERVER, labels={"app": "server"}, volumes=[TMP],
                                 mounts=[TMP_MOUNT]),
              pod_manifest(node, "client", client, SLEEPER))
        server_ip = wait_pod_ready(node, "server", served)["status"]["podIP"]
        wait_pod_ready(node, "client", client)

        def reachable() -> bool:
            return _http_get(node, "client", client, server_ip, 8080) == "served"

        assert reachable()
        apply(node, {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": {"name": "default-deny", "namespace": served},
                     "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
        wait_for(lambda: not reachable(), "the default-deny policy to close the port", timeout_s=30, interval_s=0.5)
        apply(node, {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": {"name": "from-client", "namespace": served},
                     "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                                  "kubernetes.io/metadata.name": client}}}],
                                  "ports": [{"port": 8080, "protocol": "TCP"}]}]}})
        wait_for(reachable, "the allowing policy to open the port again", timeout_s=30, interval_s=0.5)


def _http_get(node: NodePlane, pod: str, namespace: str, host: str, port: int) -> str:
    """The body of GET / on host:port from inside a Pod ("" when nothing answers within 2 s).

    nc, not wget: Debian's busybox-static wget dies of SIGSEGV on this machine, on the host as well."""
    fetched = exec_in(node, pod, namespace, "sh", "-c", f'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 2 {host} {port}',
                      check=False)
    head, _, body = fetched.stdout.replace("\r\n", "\n").partition("\n\n")
    status = head.splitlines()[0] if head else ""
    return body.strip() if fetched.returncode == 0 and " 200 " in status else ""


def _task_pid(node: NodePlane, container_id: str) -> int:
    """The host pid of a container's process, as containerd's task list gives it."""
    listed = subprocess.run(node.ctr_argv("tasks", "ls"), capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return int(fields[1])
    raise AssertionError(f"containerd lists no task {container_id}:\n{listed}")


def test_a_second_node_on_the_same_machine_is_refused_naming_the_running_one(node_plane: NodePlane,
                                                                               tmp_path: Path) -> None:
    with pytest.raises(DevClusterError) as refused:
        DevNode(tmp_path / "second").up()
    assert str(node_plane.plane.state_dir) in str(refused.value)
    assert "only one node per machine" in str(refused.value)
    assert not (tmp_path / "second" / "plane.json").exists()  # refused before starting anything
