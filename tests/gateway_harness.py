"""Running the MCP gateway as its users do: `corral mcp` over stdio or HTTP, driven by the official MCP client."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from corral.api.codes import GATEWAY_AUDIENCE
from corral.api.roles import USER_ROLE_RULES
from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import CORRAL
from tests.harness import api_client, apply_yaml, healthz, service_account_token, wait_for, wait_until_allowed

MODERN = "2026-07-28"
# `corral` with the event loop's default executor cut down to one thread (tests/tools/one_worker.py).
ONE_WORKER = [sys.executable, str(Path(__file__).resolve().parent / "tools" / "one_worker.py")]
MODES = ["legacy", MODERN]  # both protocol generations the SDK serves


def kubeconfig_for(plane: Plane, token: str, path: Path, namespace: str) -> Path:
    """A kubeconfig whose user is the bearer of `token`: the identity a stdio gateway acts as."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "p", "cluster": {"server": plane.server, "certificate-authority": str(plane.ca_file)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "p", "user": "u", "namespace": namespace}}],
    }))
    return path


def stdio_params(kubeconfig: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=CORRAL, args=["mcp", "--transport", "stdio", *extra],
                                 env={**os.environ, "KUBECONFIG": str(kubeconfig)})


@asynccontextmanager
async def stdio_client(kubeconfig: Path, *extra: str, mode: str = "legacy",
                       on_message: Callable[[Any], Any] | None = None) -> AsyncIterator[Client]:
    async with Client(stdio_params(kubeconfig, *extra), mode=mode, message_handler=on_message, cache=None) as client:
        yield client


@asynccontextmanager
async def http_client(url: str, token: str, mode: str = "legacy",
                      on_message: Callable[[Any], Any] | None = None) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode,
                            message_handler=on_message, cache=None) as client:
        yield client


class HttpGateway:
    """`corral mcp --transport http` as a process of its own, with the admin kubeconfig only for the cluster address."""

    def __init__(self, plane: Plane, namespace: str, log_path: Path, *extra: str,
                 command: list[str] | None = None, kubeconfig: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log_path = log_path
        argv = [*(command or [CORRAL]), "mcp", "--transport", "http", "--port", str(self.port), "-n", namespace, *extra]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env={**os.environ, "KUBECONFIG": str(kubeconfig or plane.kubeconfig)},
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(self._healthy, f"the gateway to answer /healthz (log: {log_path})", timeout_s=30)

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the gateway exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
        return healthz(self.port)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@contextmanager
def capabilities_readable(admin: Any, namespace: str, *service_accounts: str) -> Iterator[None]:
    """Let these ServiceAccounts `get` Capabilities (cluster-scoped contracts) for the duration of a test."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
    name = f"{namespace}-capabilities"
    rbac.create_cluster_role({"metadata": {"name": name},
                              "rules": [{"apiGroups": ["corral.dev"], "resources": ["capabilities"], "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace} for sa in service_accounts]})
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def gateway_token(admin: Any, namespace: str, name: str) -> str:
    """A token of the ServiceAccount `name` (made if missing) that the HTTP gateway accepts: its audience."""
    return service_account_token(admin, namespace, name, audience=GATEWAY_AUDIENCE)


def grant_agent(plane: Plane, admin: Any, namespace: str, name: str = "agent") -> str:
    """A ServiceAccount with the chart's agent-operator rules (corral.api.roles) in this namespace; its token
    (for the gateway's audience), once RBAC lets it write devices."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
            "rules": USER_ROLE_RULES["agent-operator"]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}
    apply_yaml(admin, yaml.safe_dump_all([role, binding]), namespace)
    token = gateway_token(admin, namespace, name)
    wait_until_allowed(api_client(plane, token=token), "write", namespace, "devices")
    return token
