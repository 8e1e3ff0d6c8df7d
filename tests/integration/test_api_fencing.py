"""Fencing at the API server (issue 31): only the Pod holding a shard's Lease may write that shard's status.

The chart's fencing objects (templates/controller-fencing.yaml) are rendered with helm and created in the real
kube-apiserver of the local plane. The plane runs no kubelet, so the two controller Pods stay Pending; that is
enough, since what the policy reads is the Pod a token is bound to (TokenRequest with boundObjectRef), and the
writes are made with the controller's own status path (Kube.apply_status: a server-side apply patch of the
status subresource) under those tokens. The first tests only render the chart and need no plane.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.devcluster.plane import Plane
from corral.kube.client import ApiError
from corral.kube.objects import Kube
from corral.reconcile.shardlabels import SHARD_LABEL, SHARDS_MANAGER, ShardLabels
from tests.harness import api_client, service_account_token, wait_for, wait_until_allowed
from tests.helm_harness import KUBE_VERSION, Helm, helm_binary

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "corral"
RELEASE = "corral"
ACCOUNT = "corral-controller"  # the chart's controller ServiceAccount for release "corral": <fullname>-controller
PREFIX = "corral-controller"  # the default lease prefix, the same name
FENCE = "templates/controller-fencing.yaml"


@pytest.fixture(scope="module")
def helm(request: pytest.FixtureRequest) -> Helm:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    return Helm(helm_binary(lambda line: reporter.write_line(f"[helm] {line}") if reporter else print(line)))


def render(helm: Helm, namespace: str, *sets: str, show_only: bool = True) -> list[dict[str, Any]]:
    args = ["template", RELEASE, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    if show_only:
        args += ["--show-only", FENCE]
    for value in ("signing.require=false", *sets):  # the chart's defaults: 2 replicas, 1 shard
        args += ["--set", value]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


ANCHOR = "corral-lease-params"


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The release's own objects of a kind (not the anchor, which outlives releases)."""
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] != ANCHOR]


def test_the_anchor_binds_leases_for_good_and_is_never_evaluated(helm: Helm) -> None:
    """kube-apiserver stops watching Leases for policies once no binding uses them (kubernetes#130887): the
    anchor is kept on uninstall, so the fence of a later release sees its Leases change."""
    docs = [d for d in render(helm, "corral-system") if d["metadata"]["name"] == ANCHOR]
    assert sorted(d["kind"] for d in docs) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for doc in docs:
        assert doc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    policy = next(d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    assert policy["paramKind"]["kind"] == "Lease"
    assert policy["matchConstraints"]["resourceRules"][0]["resources"] == ["leaseparamanchors"]  # served by none


# ---- the rendered objects ------------------------------------------------------------------------------------


def test_one_shard_is_one_binding_to_the_shard_0_lease_for_the_controller_only(helm: Helm) -> None:
    docs = render(helm, "corral-system")
    (policy,) = of_kind(docs, "ValidatingAdmissionPolicy")
    (binding,) = of_kind(docs, "ValidatingAdmissionPolicyBinding")
    spec = policy["spec"]
    assert spec["paramKind"] == {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["corral.dev"] and rule["operations"] == ["UPDATE"]
    assert sorted(rule["resources"]) == ["devices/status", "intents/status"]
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:corral-system:{ACCOUNT}'"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == "corral-corral-system-fence"
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["paramRef"] == {"name": f"{PREFIX}-shard-0", "namespace": "corral-system",
                                           "parameterNotFoundAction": "Deny"}
    assert "matchResources" not in binding["spec"]  # one shard: every object


def test_each_shard_is_a_binding_by_label_and_unlabelled_objects_are_refused(helm: Helm) -> None:
    docs = render(helm, "site", "controller.shards=3", "controller.leaderElection.leasePrefix=edge")
    bindings = {b["metadata"]["name"]: b["spec"] for b in of_kind(docs, "ValidatingAdmissionPolicyBinding")}
    for shard in range(3):
        spec = bindings[f"corral-site-fence-shard-{shard}"]
        assert spec["paramRef"] == {"name": f"edge-shard-{shard}", "namespace": "site", "parameterNotFoundAction": "Deny"}
        assert spec["matchResources"]["objectSelector"] == {"matchLabels": {SHARD_LABEL: str(shard)}}
    unsharded = bindings["corral-site-fence-unsharded"]
    assert unsharded["matchResources"]["objectSelector"]["matchExpressions"] == [
        {"key": SHARD_LABEL, "operator": "NotIn", "values": ["0", "1", "2"]}]
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind(docs, "ValidatingAdmissionPolicy")}
    assert set(policies) == {"corral-site-fence", "corral-site-fence-unsharded"}
    assert set(bindings) == {f"corral-site-fence-shard-{k}" for k in range(3)} | {"corral-site-fence-unsharded"}
    assert "paramKind" not in policies["corral-site-fence-unsharded"]
    assert policies["corral-site-fence-unsharded"]["validations"][0]["expression"] == "false"


def test_a_controller_alone_is_not_fenced(helm: Helm) -> None:
    """One replica of one shard is not fenced: it may run as a process whose token is bound to no Pod (test_chart)."""
    docs = render(helm, "corral-system", "controller.replicas=1", show_only=False)
    assert not [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy") and "-fence" in d["metadata"]["name"]]
    sharded = render(helm, "corral-system", "controller.replicas=1", "controller.shards=2")
    assert len(of_kind(sharded, "ValidatingAdmissionPolicyBinding")) == 3  # a shard may move even with one replica


# ---- on the API server ---------------------------------------------------------------------------------------


@dataclass
class Fence:
    plane: Plane
    admin: kubernetes.client.ApiClient
    namespace: str
    pods: dict[str, kubernetes.client.ApiClient]  # a client per Pod, with a token bound to it

    def client(self, token: str) -> kubernetes.client.ApiClient:
        return api_client(self.plane, token=token)

    def hold(self, shard: int, holder: str) -> None:
        """Create or take over the shard's Lease for `holder`, as the election would."""
        leases = kubernetes.client.CoordinationV1Api(self.admin)
        name = f"{PREFIX}-shard-{shard}"
        spec = {"holderIdentity": holder, "leaseDurationSeconds": 15}
        try:
            lease = leases.read_namespaced_lease(name, self.namespace)
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise
            leases.create_namespaced_lease(self.namespace, {"metadata": {"name": name}, "spec": spec})
            return
        spec["leaseTransitions"] = (lease.spec.lease_transitions or 0) + 1
        leases.patch_namespaced_lease(name, self.namespace, {"spec": spec})

    def device(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        body = {"apiVersion": API_VERSION, "kind": "Device", "metadata": {"name": name, "labels": labels or {}},
                "spec": {"deviceId": name}}
        created: dict[str, Any] = kubernetes.client.CustomObjectsApi(self.admin).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "devices", body)
        return created


def write_status(client: kubernetes.client.ApiClient, namespace: str, plural: str, name: str) -> ApiError | None:
    """The controller's own status write (server-side apply on the status subresource): None if admitted."""
    kind, status = ("Device", {"online": True}) if plural == "devices" else ("Intent", {"phase": "Pending"})

    async def write() -> None:
        kube = Kube(client.configuration)
        try:
            await kube.apply_status(plural, namespace, name, kind, status, "fencing-test")
        finally:
            await kube.close()

    try:
        asyncio.run(write())
    except ApiError as err:
        return err
    return None


def refused(fence: Fence, who: str, plural: str, name: str, saying: str, what: str) -> ApiError:
    """Wait for `who`'s status write to be refused saying `saying`: a new policy, or a Lease's new holder, reaches
    the API server's admission a moment after it is written."""
    def probe() -> ApiError | None:
        answer = write_status(fence.pods[who], fence.namespace, plural, name)
        return answer if answer is not None and answer.status == 403 and saying in answer.message else None
    refusal = wait_for(probe, what, timeout_s=30)
    assert refusal is not None
    return refusal


ROLE = {"rules": [
    {"apiGroups": ["corral.dev"], "resources": ["devices"], "verbs": ["get", "patch"]},
    {"apiGroups": ["corral.dev"], "resources": ["devices/status", "intents/status"], "verbs": ["patch"]},
]}


@pytest.fixture
def fenced(helm: Helm, plane: Plane, corral_api: kubernetes.client.ApiClient,
           namespace: str) -> Iterator[Callable[..., Fence]]:
    """Install the chart's fence for `shards` in the test namespace (the release namespace), with the controller
    ServiceAccount, a Role to write status, and two Pods poda and podb each with a token bound to it."""
    admin = corral_api
    admission = kubernetes.client.AdmissionregistrationV1Api(admin)
    made: list[tuple[str, str]] = []

    def install(*sets: str) -> Fence:
        for doc in render(helm, namespace, *sets):
            create = (admission.create_validating_admission_policy if doc["kind"] == "ValidatingAdmissionPolicy"
                      else admission.create_validating_admission_policy_binding)
            if doc["metadata"]["name"] == ANCHOR:
                # Kept for good, as helm keeps it: made by the first test on this plane, or an earlier run.
                try:
                    create(doc)
                except kubernetes.client.ApiException as err:
                    if err.status != 409:
                        raise
                continue
            create(doc)
            made.append((doc["kind"], doc["metadata"]["name"]))
        core = kubernetes.client.CoreV1Api(admin)
        rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
        core.create_namespaced_service_account(namespace, {"metadata": {"name": ACCOUNT}})
        rbac.create_namespaced_role(namespace, {"metadata": {"name": "status-writer"}, **ROLE})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "status-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "status-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]})
        pods = {}
        for name in ("poda", "podb"):
            pod = core.create_namespaced_pod(namespace, {
                "metadata": {"name": name},
                "spec": {"serviceAccountName": ACCOUNT, "automountServiceAccountToken": False,
                         "containers": [{"name": "controller", "image": "corral.invalid/controller:none"}]}})
            token = core.create_namespaced_service_account_token(ACCOUNT, namespace, {"spec": {
                "audiences": [], "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                                   "uid": pod.metadata.uid}}})
            pods[name] = api_client(plane, token=token.status.token)
        # A token of the same ServiceAccount bound to no Pod (what `kubectl create token` gives).
        pods["unbound"] = api_client(plane, token=service_account_token(admin, namespace, ACCOUNT))
        wait_until_allowed(pods["poda"], "patch", namespace, "devices")
        return Fence(plane, admin, namespace, pods)

    try:
        yield install
    finally:
        for kind, name in reversed(made):
            if kind == "ValidatingAdmissionPolicy":
                admission.delete_validating_admission_policy(name)
            else:
                admission.delete_validating_admission_policy_binding(name)


def admin_username(admin: kubernetes.client.ApiClient) -> str:
    review = kubernetes.client.AuthenticationV1Api(admin).create_self_subject_review({})
    return str(review.status.user_info.username)


def test_only_the_pod_holding_the_lease_writes_status_and_a_handover_swaps_the_answers(
        fenced: Callable[..., Fence], say: Callable[[str], None]) -> None:
    started = time.monotonic()
    fence = fenced()
    fence.hold(0, "poda_1234")
    fence.device("lamp")
    intent = kubernetes.client.CustomObjectsApi(fence.admin).create_namespaced_custom_object(
        GROUP, VERSION, fence.namespace, "intents", {
            "apiVersion": API_VERSION, "kind": "Intent", "metadata": {"name": "lamp-on"},
            "spec": {"device": "lamp", "actuator": "power", "action": "set_state", "params": {"value": True},
                     "reason": "fencing test", "requester": admin_username(fence.admin)}})
    name = intent["metadata"]["name"]

    # A policy is loaded a moment after it is created: wait for its first refusal, then the rest holds at once.
    refusal = refused(fence, "podb", "devices", "lamp", "is held by", "podb's write to be fenced")
    assert f'Lease {fence.namespace}/{PREFIX}-shard-0, which is held by "poda_1234", not by pod podb' in refusal.message
    assert write_status(fence.pods["poda"], fence.namespace, "devices", "lamp") is None
    assert write_status(fence.pods["poda"], fence.namespace, "intents", name) is None
    intent_refusal = write_status(fence.pods["podb"], fence.namespace, "intents", name)
    assert intent_refusal is not None and intent_refusal.status == 403 and "poda_1234" in intent_refusal.message
    unbound = write_status(fence.pods["unbound"], fence.namespace, "devices", "lamp")
    assert unbound is not None and unbound.status == 403 and "bound to no Pod" in unbound.message

    fence.hold(0, "podb_5678")  # the election hands the Lease over
    moved = refused(fence, "poda", "devices", "lamp", '"podb_5678"', "poda's write to be fenced")
    assert "not by pod poda" in moved.message
    assert write_status(fence.pods["podb"], fence.namespace, "devices", "lamp") is None
    assert write_status(fence.pods["podb"], fence.namespace, "intents", name) is None

    fence.hold(0, "")  # released: nobody writes
    refused(fence, "podb", "devices", "lamp", "nobody holds", "a released Lease to fence everyone")

    # Uninstall and install again: with no fence bound, the API server drops what it watched for it; the anchor
    # keeps it watching Leases, so the new fence judges by the holder as it is now, not as it was last seen.
    admission = kubernetes.client.AdmissionregistrationV1Api(fence.admin)
    (binding,) = [b for b in admission.list_validating_admission_policy_binding().items
                  if b.metadata.name.endswith(f"{fence.namespace}-fence-shard-0")]
    admission.delete_validating_admission_policy_binding(binding.metadata.name)
    wait_for(lambda: write_status(fence.pods["podb"], fence.namespace, "devices", "lamp") is None,
             "the unbound fence to admit every write", 30)
    fence.hold(0, "poda_4321")
    admission.create_validating_admission_policy_binding({
        "metadata": {"name": binding.metadata.name},
        "spec": {"policyName": binding.spec.policy_name, "validationActions": ["Deny"],
                 "paramRef": {"name": f"{PREFIX}-shard-0", "namespace": fence.namespace,
                              "parameterNotFoundAction": "Deny"}}})
    refused(fence, "podb", "devices", "lamp", '"poda_4321"', "the fence bound again to refuse podb")
    fence.hold(0, "podb_8765")
    refused(fence, "poda", "devices", "lamp", '"podb_8765"', "the fence bound again to see the Lease change hands")
    assert write_status(fence.pods["podb"], fence.namespace, "devices", "lamp") is None
    say(f"API-server fencing, one shard: {time.monotonic() - started:.1f} s")


def test_with_shards_each_object_is_fenced_by_its_shard_lease_and_unlabelled_ones_are_refused(
        fenced: Callable[..., Fence], say: Callable[[str], None]) -> None:
    started = time.monotonic()
    fence = fenced("controller.shards=2")
    fence.hold(0, "podb_5678")
    fence.hold(1, "poda_1234")
    fence.device("heater", {SHARD_LABEL: "1"})
    plain = fence.device("fan")

    refusal = refused(fence, "podb", "devices", "heater", "is held by", "podb's write to be fenced")
    assert f'{PREFIX}-shard-1, which is held by "poda_1234"' in refusal.message
    assert write_status(fence.pods["poda"], fence.namespace, "devices", "heater") is None  # shard 0 is not its

    unlabelled = write_status(fence.pods["poda"], fence.namespace, "devices", "fan")
    assert unlabelled is not None and unlabelled.status == 403
    assert "no label corral.dev/shard" in unlabelled.message and '("0" to "1")' in unlabelled.message

    # The owner labels the object first (a metadata write, not fenced), then its status write is admitted.
    async def label(body: dict[str, Any]) -> dict[str, Any] | None:
        kube = Kube(fence.pods["poda"].configuration)
        try:
            return await ShardLabels(kube, 2).ensure("devices", body, 1)
        finally:
            await kube.close()

    labelled = asyncio.run(label(plain))
    assert labelled is not None and labelled["metadata"]["labels"][SHARD_LABEL] == "1"
    assert any(m["manager"] == SHARDS_MANAGER for m in labelled["metadata"]["managedFields"])
    assert asyncio.run(label(labelled)) is None  # already right: nothing written
    assert write_status(fence.pods["poda"], fence.namespace, "devices", "fan") is None
    taken = write_status(fence.pods["podb"], fence.namespace, "devices", "fan")
    assert taken is not None and taken.status == 403 and "poda_1234" in taken.message
    say(f"API-server fencing, two shards: {time.monotonic() - started:.1f} s")


@pytest.fixture
def say(request: pytest.FixtureRequest) -> Callable[[str], None]:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    return lambda line: reporter.write_line(line) if reporter else print(line)
