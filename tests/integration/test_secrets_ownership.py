"""A release installed again under the same name keeps the Secrets its pods were given (issue 28).

`helm uninstall` deletes the controller's ServiceAccount; the next install makes one of the same name with a new
uid. The Secrets and the ConfigMap `corral secrets ensure` made belong to the old one, and the garbage collector
deletes them some seconds later. An init container that ran first must not hand those out as they are: it gives
them to the live ServiceAccount (client/ownership.py). Here on the real API server, as the chart's init
container runs: as the controller's ServiceAccount, with the chart's rights (create; get and update by name).

The plain plane runs no garbage collector, so the first tests show the references ensure leaves, which decide
what the collector does once it runs; the last one runs on the real node's controller-manager and shows the
collector itself keeping the re-pointed Secret and deleting one that was not re-pointed.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from click.testing import CliRunner

from corral.cli.main import cli
from corral.devcluster.node import NodePlane
from corral.devcluster.plane import Plane
from tests.gateway_harness import kubeconfig_for
from tests.harness import api_client, service_account_token, wait_for, wait_until_allowed
from tests.node_harness import node_namespace

pytestmark = pytest.mark.integration

ACCOUNT = "corral-controller"
# What the chart's init container makes, by the chart's names for release `corral` (charts/corral/templates/
# _helpers.tpl, corral.ownSecrets): owned by the ServiceAccount, except the audit keys, kept on uninstall.
OWNED_SECRETS = ["corral-controller-serving", "corral-mosquitto-tls", "corral-mosquitto-ca", "corral-broker-accounts"]
OWNED_CONFIGMAP = "corral-controller-serving-ca"
KEYS = "corral-audit-keys"
ENSURE = ["--ed25519", f"{KEYS}/controller.pem",
          "--server-cert", "corral-controller-serving=corral-controller.corral.svc,localhost",
          "--publish-ca", f"corral-controller-serving=configmap/{OWNED_CONFIGMAP}",
          "--password", "corral-broker-accounts/controller-password",
          "--server-cert", "corral-mosquitto-tls=corral-mosquitto.corral.svc",
          "--publish-ca", "corral-mosquitto-tls=secret/corral-mosquitto-ca"]
KEEP = ["--keep", KEYS]


@dataclass
class Release:
    """The controller's ServiceAccount and the chart's rights for its init container, in one namespace."""

    plane: Plane
    admin: kubernetes.client.ApiClient
    namespace: str
    state: Path

    def install(self) -> str:
        """Make the ServiceAccount (again, after `uninstall`); its uid."""
        token = service_account_token(self.admin, self.namespace, ACCOUNT)
        kubeconfig_for(self.plane, token, self.state / "controller.kubeconfig", self.namespace)
        wait_until_allowed(api_client(self.plane, token=token), "create", self.namespace, "secrets", group="")
        return str(self.core.read_namespaced_service_account(ACCOUNT, self.namespace).metadata.uid)

    def uninstall(self) -> None:
        """What `helm uninstall` does to the owner: the ServiceAccount goes (the garbage collector, if one runs,
        starts on its dependents)."""
        self.core.delete_namespaced_service_account(ACCOUNT, self.namespace)
        wait_for(lambda: ACCOUNT not in self._accounts(), f"ServiceAccount {ACCOUNT} gone")

    def ensure(self, *args: str) -> None:
        """`corral secrets ensure` as the init container runs it: as the ServiceAccount."""
        done = CliRunner().invoke(cli, ["secrets", "ensure", "--kubeconfig", str(self.state / "controller.kubeconfig"),
                                        "--namespace", self.namespace, *args])
        assert done.exit_code == 0, done.output

    def owners(self, kind: str, name: str) -> list[tuple[str, str, str]]:
        obj = self._read(kind, name)
        return [(ref.kind, ref.name, ref.uid) for ref in obj.metadata.owner_references or []]

    def content(self) -> dict[str, Any]:
        """What the pods were handed: every key of every object ensure made."""
        found: dict[str, Any] = {name: self._read("secret", name).data for name in [*OWNED_SECRETS, KEYS]}
        found[OWNED_CONFIGMAP] = self._read("configmap", OWNED_CONFIGMAP).data
        return found

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.admin)

    def _read(self, kind: str, name: str) -> Any:
        if kind == "configmap":
            return self.core.read_namespaced_config_map(name, self.namespace)
        return self.core.read_namespaced_secret(name, self.namespace)

    def _accounts(self) -> set[str]:
        return {a.metadata.name for a in self.core.list_namespaced_service_account(self.namespace).items}


def grant_the_charts_rights(admin: kubernetes.client.ApiClient, namespace: str) -> None:
    """The chart's Role for the init container (controller-rbac.yaml, `-own-secrets`): create, and get and update
    its own objects by name; bound to the ServiceAccount by name, so it holds for the next one of that name."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "corral-controller-own-secrets"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [*OWNED_SECRETS, KEYS],
         "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [OWNED_CONFIGMAP], "verbs": ["get", "update"]},
    ]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "corral-controller-own-secrets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "corral-controller-own-secrets"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]})


@pytest.fixture
def release(plane: Plane, kube: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> Release:
    grant_the_charts_rights(kube, namespace)
    return Release(plane, kube, namespace, tmp_path)


def test_a_reinstall_under_the_same_name_gives_the_old_secrets_to_the_new_service_account(release: Release) -> None:
    """Installed, uninstalled, installed again before any garbage collector ran: every object ensure handed out
    belongs to the live ServiceAccount alone (so the collector, which deletes an object only when all its owners
    are gone, keeps it), with the very passwords, keys and CAs the first install made; the kept audit keys
    belong to nobody."""
    first = release.install()
    release.ensure(*ENSURE, *KEEP)
    for name in OWNED_SECRETS:
        assert release.owners("secret", name) == [("ServiceAccount", ACCOUNT, first)], name
    assert release.owners("configmap", OWNED_CONFIGMAP) == [("ServiceAccount", ACCOUNT, first)]
    handed_out = release.content()

    release.uninstall()
    second = release.install()
    assert second != first
    release.ensure(*ENSURE, *KEEP)

    for name in OWNED_SECRETS:
        assert release.owners("secret", name) == [("ServiceAccount", ACCOUNT, second)], name
    assert release.owners("configmap", OWNED_CONFIGMAP) == [("ServiceAccount", ACCOUNT, second)]
    assert release.owners("secret", KEYS) == [], "kept: the audit log needs its key after an uninstall"
    assert release.content() == handed_out, "the new release goes on with what the first one made"

    # Once settled, a start writes nothing (so the update above was the re-pointing, not a rewrite each time).
    versions = {name: release.core.read_namespaced_secret(name, release.namespace).metadata.resource_version
                for name in OWNED_SECRETS}
    release.ensure(*ENSURE, *KEEP)
    assert {name: release.core.read_namespaced_secret(name, release.namespace).metadata.resource_version
            for name in OWNED_SECRETS} == versions


def test_keys_kept_by_the_new_release_lose_the_old_owner(release: Release) -> None:
    """The first install did not keep its audit keys (audit.keepOnUninstall=false), the next one, right after,
    does: its keys must not go with the old ServiceAccount. And the other way: keys the first install kept are
    not taken by the next one, which leaves what nobody owns to whoever made it."""
    first = release.install()
    release.ensure("--ed25519", f"{KEYS}/controller.pem")
    assert release.owners("secret", KEYS) == [("ServiceAccount", ACCOUNT, first)]
    key = release.core.read_namespaced_secret(KEYS, release.namespace).data

    release.uninstall()
    release.install()
    release.ensure("--ed25519", f"{KEYS}/controller.pem", *KEEP)
    assert release.owners("secret", KEYS) == []
    assert release.core.read_namespaced_secret(KEYS, release.namespace).data == key

    release.uninstall()
    release.install()
    release.ensure("--ed25519", f"{KEYS}/controller.pem")
    assert release.owners("secret", KEYS) == [], "a Secret owned by nobody is not adopted"


def test_secrets_ensure_says_so_when_a_secret_is_being_deleted(release: Release) -> None:
    """An object held only by a finalizer is about to go: ensure refuses to hand it out, and says why and what
    to do (in the pod, the kubelet runs the init container again)."""
    release.install()
    release.core.create_namespaced_secret(release.namespace, {
        "metadata": {"name": "corral-broker-accounts", "finalizers": ["corral.dev/test-hold"]},
        "type": "Opaque", "data": {"controller-password": base64.b64encode(b"x" * 32).decode()}})
    release.core.delete_namespaced_secret("corral-broker-accounts", release.namespace)
    try:
        done = CliRunner().invoke(cli, ["secrets", "ensure", "--kubeconfig",
                                        str(release.state / "controller.kubeconfig"), "--namespace",
                                        release.namespace, "--password", "corral-broker-accounts/controller-password"])
        assert done.exit_code != 0
        assert f"Secret {release.namespace}/corral-broker-accounts is being deleted" in done.output
        assert "corral.dev/test-hold" in done.output and "run again once it is gone" in done.output
    finally:
        release.core.patch_namespaced_secret("corral-broker-accounts", release.namespace,
                                             {"metadata": {"finalizers": None}})


# On the real node: the garbage collector of its kube-controller-manager.

HOLD = "corral.dev/test-hold-deletes"  # label of the Secrets whose deletion the policy below refuses, for a while


@pytest.fixture
def node_release(node_plane: NodePlane, tmp_path: Path) -> Iterator[Release]:
    admin = api_client(node_plane.plane)
    with node_namespace(node_plane, "secrets-gc") as namespace:
        grant_the_charts_rights(admin, namespace)
        yield Release(node_plane.plane, admin, namespace, tmp_path)


def test_the_garbage_collector_keeps_what_a_reinstall_re_pointed(node_release: Release) -> None:
    """What this proves: with a real garbage collector that has ALREADY decided to delete the previous release's
    Secret (its owner gone), an init container that re-points the Secret before the delete lands keeps it: the
    collector re-reads it, finds the live owner, and leaves it with its data. A Secret of the same release that
    ensure did not touch is deleted by the same collector, so the collector did run and would have deleted.

    How the race is made certain instead of hoped for: a ValidatingAdmissionPolicy refuses deletes of the labelled
    Secrets while the ServiceAccount is deleted and made again and ensure runs (the collector's delete fails
    and is retried, as one that lost the race would be), then the policy is removed. A second, dangling
    reference (to a ConfigMap that never existed), which ensure leaves alone, shows that the collector looked at
    the re-pointed Secret afterwards: it removes a dangling reference only from an object it keeps."""
    release = node_release
    namespace = release.namespace
    held = "corral-broker-accounts"
    first = release.install()
    release.ensure("--password", f"{held}/controller-password")
    release.core.create_namespaced_secret(namespace, {  # of the same release, but not ensured again
        "metadata": {"name": "left-alone", "labels": {HOLD: "true"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "ServiceAccount", "name": ACCOUNT, "uid": first}]},
        "type": "Opaque"})
    password = release.core.read_namespaced_secret(held, namespace).data

    with refused_deletes(release.admin, namespace):
        ghost = {"apiVersion": "v1", "kind": "ConfigMap", "name": "never-was", "uid": "0b0e2d6c-0000-4000-8000-000000000000"}
        release.core.patch_namespaced_secret(held, namespace, {"metadata": {"labels": {HOLD: "true"}}})
        release.uninstall()
        # The collector saw the owner go and tries to delete both (refused); now the dangling reference too.
        secret = release.core.read_namespaced_secret(held, namespace)
        secret.metadata.owner_references = [*secret.metadata.owner_references, ghost]
        release.core.replace_namespaced_secret(held, namespace, secret)
        second = release.install()
        release.ensure("--password", f"{held}/controller-password")
        # (The collector may drop the dangling reference at any moment from now on: only ours is looked at.)
        assert [o for o in release.owners("secret", held) if o[0] == "ServiceAccount"] == [
            ("ServiceAccount", ACCOUNT, second)]

    wait_for(lambda: "left-alone" not in secret_names(release), "the collector to delete the Secret not re-pointed",
             timeout_s=120, interval_s=0.5)
    wait_for(lambda: release.owners("secret", held) == [("ServiceAccount", ACCOUNT, second)],
             "the collector to keep the re-pointed Secret and drop its dangling reference", timeout_s=120, interval_s=0.5)
    assert release.core.read_namespaced_secret(held, namespace).data == password


def secret_names(release: Release) -> set[str]:
    return {s.metadata.name for s in release.core.list_namespaced_secret(release.namespace).items}


@contextmanager
def refused_deletes(admin: kubernetes.client.ApiClient, namespace: str) -> Iterator[None]:
    """Deletes of the Secrets labelled HOLD in `namespace` refused by a ValidatingAdmissionPolicy, by anyone (the
    garbage collector included), until the block ends; waits until that is in force, and until it is not."""
    api = kubernetes.client.AdmissionregistrationV1Api(admin)
    core = kubernetes.client.CoreV1Api(admin)
    name = f"hold-deletes-{namespace}"

    def probe_deletable() -> bool:
        try:
            core.delete_namespaced_secret("hold-probe", namespace, dry_run="All")
        except kubernetes.client.ApiException as err:
            if err.status in (403, 422) and "held by the test" in (err.body or ""):
                return False
            raise
        return True

    api.create_validating_admission_policy({
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                         "operations": ["DELETE"], "resources": ["secrets"]}]},
                 "validations": [{"expression": "false", "message": "held by the test"}]}})
    try:
        api.create_validating_admission_policy_binding({
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                     "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                                        "objectSelector": {"matchLabels": {HOLD: "true"}}}}})
        core.create_namespaced_secret(namespace, {"metadata": {"name": "hold-probe", "labels": {HOLD: "true"}}})
        wait_for(lambda: not probe_deletable(), "the policy refusing deletes to be in force", timeout_s=30)
        yield
    finally:
        for delete in (api.delete_validating_admission_policy_binding, api.delete_validating_admission_policy):
            try:
                delete(name)
            except kubernetes.client.ApiException as err:
                if err.status != 404:
                    raise
    wait_for(probe_deletable, "the policy refusing deletes to be gone", timeout_s=30)
