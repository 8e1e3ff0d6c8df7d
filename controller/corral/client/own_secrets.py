"""Secrets a Corral component makes for itself at run time, instead of a Helm template generating them.

Why: what a template generates (`genPrivateKey`, `genCA`, `randAlphaNum`, kept with `lookup`) lands in every
Helm release record, and every `helm template` or GitOps render makes new keys. So the chart's controller pod
runs `corral secrets ensure` in an init container: each Secret is created when it is absent and read when it
is there, and the pod's own files are written from it into a memory-backed volume.

Idempotent under races: two starts at once both try to create; the loser gets 409 Conflict, reads what the
winner made and uses that, so everyone converges on one Secret. An update (a key added, a certificate made
again for new names) carries the resourceVersion it read, so a concurrent one is retried on fresh data and
never overwrites a key another start has handed out.

Ownership: each Secret gets an ownerReference to the ServiceAccount the step runs as (the chart's controller
ServiceAccount), so Kubernetes' garbage collector removes it with the release; a Secret kept (`keep`: the audit
signing keys, which a kept log needs) gets none and outlives an uninstall. One found with a reference to a
previous ServiceAccount of that name (an install right after an uninstall of the same release) is re-pointed to
the live one before it is handed out, so the collector does not delete it under the new release
(`client/ownership.py` says why that cannot lose the race).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import kubernetes

from corral.client.ownership import Owner, settled_references
from corral.client.secret_material import Wanted, fill

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "corral-secrets-ensure"  # not Helm: Helm neither owns nor deletes these
ATTEMPTS = 8  # a conflict means another start wrote first; a few rounds settle any realistic race


class EnsureError(RuntimeError):
    """The API server refused, or a Secret could not be settled; the sentence says which and why."""


def service_account_owner(client: kubernetes.client.ApiClient, namespace: str) -> Owner | None:
    """The ServiceAccount the client authenticates as, when it is one of `namespace` (SelfSubjectReview, which
    needs no rights: its uid is in the answer); None for any other caller (a person running it by hand)."""
    review = kubernetes.client.AuthenticationV1Api(client).create_self_subject_review({})
    user = review.status.user_info
    prefix = f"system:serviceaccount:{namespace}:"
    if not user.username.startswith(prefix) or not user.uid:
        return None
    return Owner(user.username.removeprefix(prefix), user.uid)


def ensure_secret(client: kubernetes.client.ApiClient, namespace: str, wanted: Wanted, owner: Owner | None,
                  labels: dict[str, str] | None = None, *, keep: bool = False) -> dict[str, bytes]:
    """The Secret's data once it holds everything `wanted` asks for: made when absent (owned by `owner`, or by
    nobody with `keep`), completed when something is missing, left alone when nothing is; its references to a
    ServiceAccount of the owner's name settled (`ownership.settled_references`) in the same write."""
    core = kubernetes.client.CoreV1Api(client)
    for _ in range(ATTEMPTS):
        current = _read(core, namespace, wanted.name)
        if current is not None and current.type != wanted.secret_type:
            raise EnsureError(f"Secret {namespace}/{wanted.name} is of type {current.type}, not {wanted.secret_type}: "
                              "it was not made by Corral; delete it or choose another name")
        _refuse_if_going(current, f"Secret {namespace}/{wanted.name}")
        data = _decoded(current.data if current is not None else None)
        new = fill(wanted, data if current is not None else None)
        references = _settled(client, current, owner, keep)
        if new is None and references is None:
            return data
        try:
            if current is None:
                assert new is not None  # fill makes the whole data when there is no Secret yet
                core.create_namespaced_secret(namespace, _body(wanted, new, None if keep else owner, labels))
            else:
                if new is not None:
                    current.data = _encoded(new)
                if references is not None:
                    current.metadata.owner_references = references
                core.replace_namespaced_secret(wanted.name, namespace, current)  # with the resourceVersion read
            return new if new is not None else data
        except kubernetes.client.ApiException as err:
            if err.status not in (404, 409):
                raise
            # 409: another start created or changed it first; 404: the garbage collector deleted it after we
            # read it (a previous release's). Read again and go on from what is there now.
    raise EnsureError(f"Secret {namespace}/{wanted.name} kept changing under {ATTEMPTS} attempts to settle it")


def publish_ca(client: kubernetes.client.ApiClient, namespace: str, ca_pem: bytes, target: str,
               owner: Owner | None, labels: dict[str, str] | None = None) -> bool:
    """Put a CA certificate (never its key) where readers find it: `configmap/NAME` or `secret/NAME` (key
    ca.crt, in `namespace`, owned by `owner`: re-pointed from a previous ServiceAccount of its name as
    `ensure_secret` does), or `apiservice/NAME` (its caBundle, which kube-apiserver verifies the server with).
    Writes only when something differs; True when it wrote."""
    kind, _, name = target.partition("/")
    if kind == "apiservice":
        return _patch_ca_bundle(client, name, ca_pem)
    core = kubernetes.client.CoreV1Api(client)
    read: Callable[[str, str], Any]
    body_data: dict[str, Any]
    if kind == "configmap":
        read, body_data = core.read_namespaced_config_map, {"data": {"ca.crt": ca_pem.decode()}}
        create, replace = core.create_namespaced_config_map, core.replace_namespaced_config_map
    elif kind == "secret":
        read, body_data = core.read_namespaced_secret, {"data": _encoded({"ca.crt": ca_pem}), "type": "Opaque"}
        create, replace = core.create_namespaced_secret, core.replace_namespaced_secret
    else:
        raise EnsureError(f"{target!r}: publish a CA to configmap/NAME, secret/NAME or apiservice/NAME")
    for _ in range(ATTEMPTS):
        current = _read_with(read, namespace, name)
        try:
            if current is None:
                create(namespace, {"metadata": _metadata(name, owner, labels), **body_data})
                return True
            _refuse_if_going(current, f"{kind} {namespace}/{name}")
            references = _settled(client, current, owner, keep=False)
            if kind == "configmap":
                same = (current.data or {}).get("ca.crt") == ca_pem.decode()
                current.data = {**(current.data or {}), "ca.crt": ca_pem.decode()}
            else:
                same = _decoded(current.data).get("ca.crt") == ca_pem
                current.data = {**(current.data or {}), **_encoded({"ca.crt": ca_pem})}
            if same and references is None:
                return False
            if references is not None:
                current.metadata.owner_references = references
            replace(name, namespace, current)
            return True
        except kubernetes.client.ApiException as err:
            if err.status not in (404, 409):
                raise
    raise EnsureError(f"{kind} {namespace}/{name} kept changing under {ATTEMPTS} attempts to publish the CA")


def _settled(client: kubernetes.client.ApiClient, current: Any, owner: Owner | None,
             keep: bool) -> list[dict[str, Any]] | None:
    if current is None:
        return None
    found = client.sanitize_for_serialization(current.metadata.owner_references or [])
    return settled_references(found, owner, keep)


def _refuse_if_going(current: Any, what: str) -> None:
    """An object being deleted (held only by its finalizers) cannot be handed out: it is about to go."""
    if current is not None and current.metadata.deletion_timestamp is not None:
        raise EnsureError(f"{what} is being deleted (finalizers: {', '.join(current.metadata.finalizers or [])}); "
                          "run again once it is gone (in a pod, the kubelet restarts this step)")


def _patch_ca_bundle(client: kubernetes.client.ApiClient, name: str, ca_pem: bytes) -> bool:
    api = kubernetes.client.ApiregistrationV1Api(client)
    try:
        current = api.read_api_service(name)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            raise EnsureError(f"APIService {name} does not exist: install the chart's readings-apiservice.yaml "
                              "first, or leave out --publish-ca apiservice/...") from None
        raise
    wanted = base64.b64encode(ca_pem).decode()
    have = current.spec.ca_bundle
    if isinstance(have, bytes):
        have = base64.b64encode(have).decode()
    if have == wanted:
        return False
    # A merge patch of caBundle alone: Helm's own fields (service, priorities) stay Helm's.
    api.patch_api_service(name, {"spec": {"caBundle": wanted}})
    return True


def _read(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> Any:
    return _read_with(core.read_namespaced_secret, namespace, name)


def _read_with(read: Callable[[str, str], Any], namespace: str, name: str) -> Any:
    try:
        return read(name, namespace)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return None
        raise


def _metadata(name: str, owner: Owner | None, labels: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {**(labels or {}), MANAGED_BY_LABEL: MANAGED_BY}}
    if owner is not None:
        meta["ownerReferences"] = [owner.reference()]
    return meta


def _body(wanted: Wanted, data: dict[str, bytes], owner: Owner | None,
          labels: dict[str, str] | None) -> dict[str, Any]:
    return {"metadata": _metadata(wanted.name, owner, labels), "type": wanted.secret_type, "data": _encoded(data)}


def _decoded(data: dict[str, str] | None) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (data or {}).items()}


def _encoded(data: dict[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode() for key, value in data.items()}
