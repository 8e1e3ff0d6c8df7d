"""The add-ons a k3s server deploys on its node, as Kubernetes objects: CoreDNS (the cluster DNS at
nodeconfig.CLUSTER_DNS), local-path-provisioner with the default StorageClass `local-path`, and the RBAC the
node's own parts need (the API server's kubelet client, kube-router's policy controller).

Pure: image references and paths in, manifests (dicts) out, applied by node.py with server-side apply as field
manager `corral-dev`. They follow k3s' manifests/coredns.yaml and manifests/local-storage.yaml; the images are
the ones built here (images.py) and are never pulled (imagePullPolicy Never, the helper's IfNotPresent).
"""

from __future__ import annotations

import json
from typing import Any

from corral.devcluster import nodeconfig, nodepki

Manifest = dict[str, Any]
SYSTEM = "kube-system"
FIELD_MANAGER = "corral-dev"
COREDNS = "coredns"
LOCAL_PATH = "local-path-provisioner"
STORAGE_CLASS = "local-path"

COREFILE = f"""\
.:53 {{
    errors
    health
    ready
    kubernetes {nodeconfig.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }}
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
}}
"""


def node_rbac() -> list[Manifest]:
    """Rights of the node's parts that Kubernetes' default roles do not name."""
    return [
        _binding("corral:kube-apiserver-kubelet-client", "system:kubelet-api-admin",
                 {"kind": "User", "name": nodepki.APISERVER_KUBELET_CLIENT, "apiGroup": "rbac.authorization.k8s.io"}),
        _cluster_role("corral:kube-router", [
            {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        ]),
        _binding("corral:kube-router", "corral:kube-router",
                 {"kind": "User", "name": nodepki.COMPONENT_IDENTITIES["kube-router"].common_name,
                  "apiGroup": "rbac.authorization.k8s.io"}),
    ]


def coredns(image: str) -> list[Manifest]:
    labels = {"k8s-app": "kube-dns"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": COREDNS, "namespace": SYSTEM}},
        _cluster_role("system:coredns", [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ]),
        _binding("system:coredns", "system:coredns",
                 {"kind": "ServiceAccount", "name": COREDNS, "namespace": SYSTEM}),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": COREDNS, "namespace": SYSTEM},
         "data": {"Corefile": COREFILE}},
        _deployment(COREDNS, labels, {
            "serviceAccountName": COREDNS,
            "priorityClassName": "system-cluster-critical",
            # The host's resolver, as k3s' CoreDNS: `forward . /etc/resolv.conf` then reads the node's.
            "dnsPolicy": "Default",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": COREDNS,
                "image": image,
                "imagePullPolicy": "Never",
                "args": ["-conf", "/etc/coredns/Corefile"],
                "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
                          {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    # Port 53 as 65532: the image's binary carries cap_net_bind_service=+ep (as CoreDNS's own image
                                    # does); exec needs the capability in the bounding set, which this keeps.
                                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                "resources": {"requests": {"cpu": "50m", "memory": "30Mi"},
                              "limits": {"memory": "170Mi"}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                  "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 3},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                   "periodSeconds": 2, "failureThreshold": 3},
            }],
            "volumes": [{"name": "config", "configMap": {"name": COREDNS,
                                                         "items": [{"key": "Corefile", "path": "Corefile"}]}}],
        }),
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": SYSTEM, "labels": {**labels, "kubernetes.io/name": "CoreDNS"}},
         "spec": {"selector": labels, "clusterIP": nodeconfig.CLUSTER_DNS,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                            {"name": "metrics", "port": 9153, "protocol": "TCP"}]}},
    ]


def local_path(provisioner_image: str, helper_image: str, storage_path: str) -> list[Manifest]:
    account = "local-path-provisioner-service-account"
    labels = {"app": LOCAL_PATH}
    config = {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [storage_path]}]}
    helper_pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "helper-pod"},
        "spec": {"containers": [{"name": "helper-pod", "image": helper_image, "imagePullPolicy": "IfNotPresent"}]},
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": SYSTEM}},
        _cluster_role("local-path-provisioner-role", [
            {"apiGroups": [""], "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods/log"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["endpoints", "persistentvolumes", "pods"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
        ]),
        _binding("local-path-provisioner-bind", "local-path-provisioner-role",
                 {"kind": "ServiceAccount", "name": account, "namespace": SYSTEM}),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "local-path-config", "namespace": SYSTEM},
         "data": {
             "config.json": json.dumps(config, indent=2),
             "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "${VOL_DIR}"\nchmod 700 "${VOL_DIR}/.."\n',
             "teardown": '#!/bin/sh\nset -eu\nrm -rf "${VOL_DIR}"\n',
             "helperPod.yaml": json.dumps(helper_pod, indent=2),
         }},
        _deployment(LOCAL_PATH, labels, {
            "serviceAccountName": account,
            "priorityClassName": "system-node-critical",
            "containers": [{
                "name": LOCAL_PATH,
                "image": provisioner_image,
                "imagePullPolicy": "Never",
                "command": ["local-path-provisioner", "start", "--config", "/etc/config/config.json",
                            "--service-account-name", account, "--helper-image", helper_image,
                            "--configmap-name", "local-path-config"],
                "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath":
                                                                              "metadata.namespace"}}}],
                "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/config/"}],
            }],
            "volumes": [{"name": "config-volume", "configMap": {"name": "local-path-config"}}],
        }),
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
         "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer",
         "reclaimPolicy": "Delete"},
    ]


def _deployment(name: str, labels: dict[str, str], pod_spec: dict[str, Any]) -> Manifest:
    """One replica of a Pod in kube-system, as k3s runs its add-ons."""
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": SYSTEM, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod_spec}}}


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> Manifest:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
            "rules": rules}


def _binding(name: str, role: str, subject: dict[str, str]) -> Manifest:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject]}
