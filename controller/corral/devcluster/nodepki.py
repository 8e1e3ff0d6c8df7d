"""The node's certificates: each component's client certificate from the plane's CA, and a kubelet CA of the
node's own for the kubelet's serving certificate and the API server's client certificate towards the kubelet.

Why two CAs, as k3s has (its server-ca and client-ca): the API server must be started with its kubelet client
certificate and the kubelet's CA before the kubelet runs (restarted later, it left the node out for a minute),
and the plane's CA is made by `corral-kube serve` only on the API server's first start. The kubelet CA is made
here, beforehand; the components' client certificates are made after the plane's CA exists.

Identities, as Kubernetes' Node authorizer and default RBAC expect them: the kubelet is system:node:NAME in
group system:nodes, kube-proxy system:kube-proxy, the scheduler system:kube-scheduler, the controller-manager
system:kube-controller-manager. The API server's kubelet client is bound to system:kubelet-api-admin (nodeaddons).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corral.client.pki import KeyPair, issue, new_ca
from corral.privatefile import read_private, write_private

APISERVER_KUBELET_CLIENT = "corral:kube-apiserver-kubelet-client"


@dataclass(frozen=True)
class Identity:
    common_name: str
    organization: str | None = None


def kubelet_identity(node_name: str) -> Identity:
    return Identity(f"system:node:{node_name}", "system:nodes")


COMPONENT_IDENTITIES = {
    "kube-proxy": Identity("system:kube-proxy"),
    "scheduler": Identity("system:kube-scheduler"),
    "controller-manager": Identity("system:kube-controller-manager"),
    # kube-router reads Pods, Namespaces and NetworkPolicies with its own ClusterRole (nodeaddons).
    "kube-router": Identity("corral:kube-router"),
}


def issue_client(ca: KeyPair, identity: Identity, days: int = 825) -> KeyPair:
    return _issue(ca, identity, client=True, server_names=(), days=days)


def issue_server(ca: KeyPair, common_name: str, server_names: tuple[str, ...], days: int = 825) -> KeyPair:
    return _issue(ca, Identity(common_name), client=False, server_names=server_names, days=days)


def load_ca(cert_file: Path, key_file: Path) -> KeyPair:
    return KeyPair(key_pem=read_private(key_file, "CA key"), cert_pem=cert_file.read_bytes())


def ensure_ca(cert_file: Path, key_file: Path, common_name: str) -> KeyPair:
    """The CA in these files, made first when missing."""
    if cert_file.exists() and key_file.exists():
        return load_ca(cert_file, key_file)
    ca = new_ca(common_name)
    write_private(key_file, ca.key_pem)
    cert_file.parent.mkdir(parents=True, exist_ok=True)
    cert_file.write_bytes(ca.cert_pem)
    return ca


def write_pair(pair: KeyPair, cert_file: Path, key_file: Path) -> None:
    write_private(key_file, pair.key_pem)
    cert_file.write_bytes(pair.cert_pem)


def _issue(ca: KeyPair, identity: Identity, *, client: bool, server_names: tuple[str, ...], days: int) -> KeyPair:
    return issue(ca, identity.common_name, client=client, server_names=server_names, days=days,
                 organization=identity.organization or None)
