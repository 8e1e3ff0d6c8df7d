"""What the local node's parts are started with: containerd's configuration, the CNI network, the kubelet's and
kube-proxy's configuration files, each component's kubeconfig and command line.

Pure: paths and names in, text and argument lists out, so each choice is unit-tested without a node. The
choices follow what a k3s server writes for its own single node (k3s' pkg/agent/containerd/config.go and
pkg/agent/config), with the differences this machine forces said where they are made.
"""

from __future__ import annotations

import base64
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from corral.devcluster.imagehash import PAUSE_REF

# k3s' defaults: Pods in 10.42.0.0/16 (this one node takes 10.42.0.0/24), Services in the local plane's
# --service-cluster-ip-range, the cluster DNS at the tenth Service address.
CLUSTER_CIDR = "10.42.0.0/16"
NODE_POD_CIDR = "10.42.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DNS = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "cni0"
CNI_BIN_DIR = Path("/usr/lib/cni")
RUNC = Path("/usr/sbin/runc")
NETWORK_NAME = "corral"


@dataclass(frozen=True)
class NodeLayout:
    """Where the node keeps everything: one directory inside the plane's state directory.

    Only what the kubelet hard-codes lands outside it (nodeclean removes that): /var/lib/kubelet/device-plugins,
    /var/log/containers, /var/lib/cni (containerd's CNI result cache) and containerd-shim sockets in /run/containerd.
    """

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfigs(self) -> Path:
        return self.root / "kubeconfigs"

    def kubeconfig(self, component: str) -> Path:
        return self.kubeconfigs / f"{component}.kubeconfig"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.root / "containerd" / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "networks"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def static_pods(self) -> Path:
        return self.root / "static-pods"

    @property
    def volume_plugins(self) -> Path:
        return self.root / "volume-plugins"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy-config.yaml"

    @property
    def local_path_storage(self) -> Path:
        """Where local-path-provisioner makes each PersistentVolume's directory (k3s: /var/lib/rancher/k3s/storage)."""
        return self.root / "storage"

    @property
    def state_file(self) -> Path:
        return self.root / "node.json"


def containerd_config(layout: NodeLayout, pause_image: str = PAUSE_REF) -> str:
    """containerd 1.6's configuration (version 2) for the node's own containerd, apart from any system one.

    restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so runc cannot lower an OOM score; without it every
    container fails with "can't get final child's PID from pipe: EOF". SystemdCgroup off: PID 1 is not systemd.
    """
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f"root = {_toml(layout.containerd_root)}",
        f"state = {_toml(layout.containerd_state)}",
        "",
        "[grpc]",
        f"  address = {_toml(layout.containerd_socket)}",
        "[ttrpc]",
        f"  address = {_toml(str(layout.containerd_socket) + '.ttrpc')}",
        "",
        f"[{cri}]",
        f"  sandbox_image = {_toml(pause_image)}",
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        "  enable_selinux = false",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        f"  BinaryName = {_toml(RUNC)}",
        f"  Root = {_toml(layout.runc_root)}",
        "  SystemdCgroup = false",
        f"[{cri}.cni]",
        f"  bin_dir = {_toml(CNI_BIN_DIR)}",
        f"  conf_dir = {_toml(layout.cni_conf_dir)}",
        "",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_toml(layout.root / 'containerd' / 'opt')}",
        "",
    ]
    return "\n".join(lines)


def cni_conflist(layout: NodeLayout) -> str:
    """The Pod network: a bridge with the node as gateway and masquerading out of it, as k3s' flannel-less
    single node has, and portmap for hostPort. host-local keeps its leases inside the node's directory."""
    network = {
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": NODE_POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.cni_ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(network, indent=2) + "\n"


def kubelet_config(layout: NodeLayout, client_ca: Path, serving_cert: Path, serving_key: Path,
                   resolv_conf: Path = Path("/etc/resolv.conf")) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 with cgroupfs is the only setup this machine allows (PID 1 is not systemd; the v2 mount
        # holds hugetlb only). containerd 1.6 cannot report its driver (RuntimeConfig is unimplemented), so the
        # kubelet takes this one, as it says in its log.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv_conf),
        "podLogsDir": str(layout.pod_logs),
        "staticPodPath": str(layout.static_pods),
        "volumePluginDir": str(layout.volume_plugins),
        "failSwapOn": False,
        # A development machine's disk is rarely 85% free; the defaults would evict the test's Pods. Images are
        # imported here and never pulled, so garbage-collecting one would break its next Pod: GC is off.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(layout: NodeLayout, node_name: str, kubeconfig: Path) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": node_name,
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        # 0: leave the machine's conntrack table size and timeouts as they are (nodeclean has less to restore).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def component_kubeconfig(server: str, ca_pem: bytes, user: str, cert_pem: bytes, key_pem: bytes) -> str:
    """A kubeconfig that logs in with a client certificate (the kind k3s writes for each of its components)."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    return yaml.safe_dump(config, sort_keys=False)


@dataclass(frozen=True)
class ApiserverNodeFiles:
    """What the API server needs to reach the kubelet: its client certificate and the kubelet's serving CA."""

    kubelet_client_cert: Path
    kubelet_client_key: Path
    kubelet_ca: Path


def apiserver_node_flags(node_ip: str, files: ApiserverNodeFiles) -> list[str]:
    """kube-apiserver flags a plane with a node adds after its own (a later flag wins over corral-kube's).

    It listens on every address, as k3s' does on 6443, so Pods reach it through the `kubernetes` Service, which
    points at the advertised node address. The Node authorizer and NodeRestriction keep the kubelet to its own node.
    """
    return [
        "--bind-address=0.0.0.0",
        f"--advertise-address={node_ip}",
        "--enable-admission-plugins=NodeRestriction",
        f"--kubelet-client-certificate={files.kubelet_client_cert}",
        f"--kubelet-client-key={files.kubelet_client_key}",
        f"--kubelet-certificate-authority={files.kubelet_ca}",
    ]


def authorization_mode(node: bool) -> str:
    return "--authorization-mode=Node,RBAC" if node else "--authorization-mode=RBAC"


def kubelet_argv(binary: Path, layout: NodeLayout, node_name: str, node_ip: str) -> list[str]:
    return [str(binary), "kubelet", f"--config={layout.kubelet_config}",
            f"--kubeconfig={layout.kubeconfig('kubelet')}", f"--root-dir={layout.kubelet_root}",
            f"--hostname-override={node_name}", f"--node-ip={node_ip}"]


def scheduler_argv(binary: Path, layout: NodeLayout) -> list[str]:
    kubeconfig = layout.kubeconfig("scheduler")
    return [str(binary), "scheduler", f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
            "--secure-port=0"]


def controller_manager_argv(binary: Path, layout: NodeLayout, ca_cert: Path, ca_key: Path, sa_key: Path) -> list[str]:
    kubeconfig = layout.kubeconfig("controller-manager")
    # node-ipam is off: the bridge network hands out addresses from NODE_POD_CIDR itself.
    return [str(binary), "controller-manager", f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            f"--service-account-private-key-file={sa_key}", f"--root-ca-file={ca_cert}",
            f"--cluster-signing-cert-file={ca_cert}", f"--cluster-signing-key-file={ca_key}",
            "--use-service-account-credentials", "--controllers=*,-node-ipam-controller", "--leader-elect=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}", f"--cluster-cidr={CLUSTER_CIDR}",
            "--bind-address=127.0.0.1", "--secure-port=0"]


def kube_proxy_argv(binary: Path, layout: NodeLayout) -> list[str]:
    return [str(binary), "proxy", f"--config={layout.kube_proxy_config}"]


def kube_router_argv(binary: Path, node_name: str, kubeconfig: Path) -> list[str]:
    """kube-router's NetworkPolicy controller only, as k3s runs it in-process (routing and proxying are others')."""
    return [str(binary), "--run-firewall", "--run-router=false", "--run-service-proxy=false",
            f"--hostname-override={node_name}", f"--kubeconfig={kubeconfig}", "--metrics-port=0",
            "--health-port=0"]


def containerd_argv(containerd: Path, layout: NodeLayout) -> list[str]:
    return [str(containerd), f"--config={layout.containerd_config}"]


def loopback_nameservers(resolv_conf_text: str) -> list[str]:
    """The nameservers of a resolv.conf that only the host itself can reach: CoreDNS forwarding to one of them
    would ask itself (the `loop` plugin stops it) and every name outside the cluster would fail."""
    found = []
    for line in resolv_conf_text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                if ipaddress.ip_address(parts[1].split("%")[0]).is_loopback:
                    found.append(parts[1])
            except ValueError:
                continue
    return found


def _toml(value: object) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string
