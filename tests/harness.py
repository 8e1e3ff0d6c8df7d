"""Helpers for tests that talk to the real local plane: clients per identity, apply, wait.

Everything here goes to the real kube-apiserver and the real broker that the
session fixtures start; nothing is mocked.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import kubernetes
import yaml

from corral.api import KINDS
from corral.api.codes import GROUP, PEOPLE_NAMESPACE, VERSION
from corral.api.roles import USER_ROLE_RULES
from corral.client.apply import apply_yaml as apply
from corral.devcluster.plane import Plane

T = TypeVar("T")

FIELD_MANAGER = "corral-tests"


def api_client(
    plane: Plane, token: str | None = None, impersonate: str | None = None, group: str | None = None
) -> kubernetes.client.ApiClient:
    """A client for the plane: as the admin by default, or with another bearer token,
    or as the admin impersonating another user (and one group)."""
    config = kubernetes.client.Configuration()
    config.host = plane.server
    config.ssl_ca_cert = str(plane.ca_file)
    config.api_key = {"authorization": token or plane.admin_token}
    config.api_key_prefix = {"authorization": "Bearer"}
    client = kubernetes.client.ApiClient(config)
    if impersonate is not None:
        client.set_default_header("Impersonate-User", impersonate)
    if group is not None:
        client.set_default_header("Impersonate-Group", group)
    return client


def service_account_token(client: kubernetes.client.ApiClient, namespace: str, name: str,
                          audience: str | None = None) -> str:
    """Create the ServiceAccount if needed and mint a short-lived token for it (TokenRequest).

    `audience`: the token's `aud` (GATEWAY_AUDIENCE for tokens the HTTP gateway accepts); None: what the API
    server gives a request without one, all of its --api-audiences (the local plane's include GATEWAY_AUDIENCE).
    The local plane runs no controllers, so no ServiceAccount exists until a test makes one.
    """
    core = kubernetes.client.CoreV1Api(client)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    except kubernetes.client.ApiException as err:
        if err.status != 409:
            raise
    request = {"spec": {"audiences": [audience] if audience else [], "expirationSeconds": 3600}}
    response = core.create_namespaced_service_account_token(name, namespace, request)
    return str(response.status.token)


def apply_yaml(
    client: kubernetes.client.ApiClient,
    text: str,
    namespace: str | None = None,
    field_manager: str = FIELD_MANAGER,
    force: bool = False,
) -> list[object]:
    """Server-side apply every document in text, like `kubectl apply --server-side [--force-conflicts]`."""
    return apply(client, text, namespace, field_manager=field_manager, force=force)


def wait_for(probe: Callable[[], T], what: str, timeout_s: float = 10.0, interval_s: float = 0.1) -> T:
    """Call probe until it returns something truthy; fail saying what did not happen and the last answer."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = probe()
        except Exception as err:  # noqa: BLE001 - the probe's failures are the thing being waited out
            last = err
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last answer: {last!r}")
        time.sleep(interval_s)


def kubectl(plane: Plane, *args: str, context: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the kubectl built with the plane against its kubeconfig."""
    command = [str(plane.kubectl), f"--kubeconfig={plane.kubeconfig}"]
    if context:
        command.append(f"--context={context}")
    return subprocess.run([*command, *args], capture_output=True, text=True, check=check, timeout=60)


def wait_until_allowed(client: kubernetes.client.ApiClient, verb: str, namespace: str, resource: str,
                       group: str = "corral.dev", timeout_s: float = 10.0) -> None:
    """RBAC changes reach the authorizer through a watch; wait until this client may do verb."""
    authz = kubernetes.client.AuthorizationV1Api(client)

    def allowed() -> bool:
        review = authz.create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"group": group, "resource": resource, "verb": verb, "namespace": namespace}}}
        )
        return bool(review.status.allowed)

    wait_for(allowed, f"permission to {verb} {resource} in {namespace}", timeout_s=timeout_s)


GRANT_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], verbs: {device_verbs}}}
- {{apiGroups: [corral.dev], resources: [intents], verbs: [create, get, list]}}
- {{apiGroups: [corral.dev], resources: [approvals], verbs: {approval_verbs}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {namespace}}}]
"""


def grant(plane: Plane, admin: kubernetes.client.ApiClient, namespace: str, name: str, device_verbs: str,
          approval_verbs: str, wait_verb: str, person: bool = False) -> kubernetes.client.ApiClient:
    """A ServiceAccount `name` with a Role of these verbs; its client, once RBAC lets it `wait_verb` devices.

    person: the ServiceAccount is a person's (PEOPLE_NAMESPACE, named `{namespace}-{name}` there, see person_name),
    as an approver must be; the Role and its binding are in `namespace` all the same."""
    account_namespace, account = (PEOPLE_NAMESPACE, person_name(namespace, name)) if person else (namespace, name)
    if person:
        ensure_people_namespace(admin)
    apply_yaml(admin, GRANT_ROLE.format(name=name, namespace=account_namespace, account=account,
                                        device_verbs=device_verbs, approval_verbs=approval_verbs), namespace)
    client = api_client(plane, token=service_account_token(admin, account_namespace, account))
    wait_until_allowed(client, wait_verb, namespace, "devices")
    return client


def bind_approver(admin: kubernetes.client.ApiClient, namespace: str, account: str) -> None:
    """The chart's approver role in `namespace`, bound to the person's ServiceAccount `account` (in PEOPLE_NAMESPACE):
    a person who approves, grants in advance, pauses agents and keeps Rules."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "approver"},
            "rules": USER_ROLE_RULES["approver"]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "approver"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "approver"},
               "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": PEOPLE_NAMESPACE}]}
    apply_yaml(admin, yaml.safe_dump_all([role, binding]), namespace)


def token_of(client: kubernetes.client.ApiClient) -> str:
    """The bearer token a client made by api_client (or grant) sends."""
    return str(client.configuration.api_key["authorization"])


def person_name(namespace: str, name: str) -> str:
    """The ServiceAccount (in PEOPLE_NAMESPACE) of the person `name` of a test namespace."""
    return f"{namespace}-{name}"[:63]


def person_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{PEOPLE_NAMESPACE}:{person_name(namespace, name)}"


def ensure_people_namespace(admin: kubernetes.client.ApiClient) -> None:
    """The namespace whose ServiceAccounts are people; shared by every test, never deleted."""
    try:
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": PEOPLE_NAMESPACE}})
    except kubernetes.client.ApiException as err:
        if err.status != 409:
            raise


def rss_mib(pid: int) -> float:
    """Resident memory of a process, in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scrape(port: int) -> dict[str, float]:
    """A Prometheus /metrics page as {series: value}, for the corral_ series."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {m.group(1): float(m.group(2)) for line in text.splitlines()
            if (m := re.fullmatch(r"(corral_[^\s]+) ([-+\d.eE]+|NaN)", line))}


def healthz(port: int) -> bool:
    """Whether http://127.0.0.1:port/healthz answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def fresh_namespace(kube: kubernetes.client.ApiClient, label: str) -> Iterator[str]:
    """A new namespace named after `label` (a test's name) until the block ends.

    The plane runs no namespace controller, so a deleted namespace stays Terminating with its objects;
    unique names keep tests apart regardless.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:40]
    name = f"t-{slug}-{uuid.uuid4().hex[:6]}".replace("--", "-")
    core = kubernetes.client.CoreV1Api(kube)
    core.create_namespace({"metadata": {"name": name, "labels": {"corral.dev/test": "true"}}})
    try:
        yield name
    finally:
        # No namespace controller runs, so deleting the namespace alone would leave its Devices
        # behind for later controllers (on a reused `corral dev up` plane) to find.
        objects = kubernetes.client.CustomObjectsApi(kube)
        for kind in KINDS:
            if kind.scope == "Namespaced":
                try:
                    objects.delete_collection_namespaced_custom_object(GROUP, VERSION, name, kind.plural)
                except kubernetes.client.ApiException as err:
                    if err.status != 404:  # the CRDs are not installed in every test run
                        raise
        core.delete_namespace(name)
