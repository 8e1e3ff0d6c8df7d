"""Enrolling devices: a device becomes trusted only when a person enrolls it.

Enrollment makes two objects in the device's namespace, in the name of whoever enrolls:
- the Device (its name, `spec.deviceId`, the device type as a label), which the controller binds when the
  device announces itself; the controller never makes a Device on its own;
- a Secret of type `corral.dev/device-credential` with the device's broker identity (username = device id,
  a random password), from which the controller keeps the device's broker account (managed brokers), or
  which a person copies to a broker Corral does not manage (docs/device-trust.md).

Revoking keeps the Secret, marked with when it was revoked: the controller disables the account at once
(the broker disconnects the device) and the Device says why it is inert. Rotating replaces the password.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes

from corral.api.codes import API_VERSION, GROUP, VERSION

CREDENTIAL_TYPE = "corral.dev/device-credential"
DEVICE_ID_LABEL = "corral.dev/device-id"
DEVICE_TYPE_LABEL = "corral.dev/device-type"
REVOKED_ANNOTATION = "corral.dev/revoked-at"
FIELD_MANAGER = "corral-enroll"


class EnrollmentError(Exception):
    """A refused enrollment change, with a sentence a person can act on."""


@dataclass(frozen=True)
class Credential:
    namespace: str
    device: str  # the Device's name
    device_id: str
    password: str
    revoked: bool = False

    @property
    def username(self) -> str:
        return self.device_id


def secret_name(device_id: str) -> str:
    return f"corral-device-{device_id}"


def credential_of(secret: dict[str, Any]) -> Credential | None:
    """The credential a Secret holds, or None when it is not a well-formed enrollment."""
    meta = secret.get("metadata") or {}
    data = secret.get("data") or {}
    device_id = (meta.get("labels") or {}).get(DEVICE_ID_LABEL)
    if secret.get("type") != CREDENTIAL_TYPE or not device_id or "password" not in data:
        return None
    try:
        password = base64.b64decode(data["password"]).decode()
        device = base64.b64decode(data.get("device", "")).decode() or device_id
    except (ValueError, UnicodeDecodeError):
        return None
    revoked = REVOKED_ANNOTATION in (meta.get("annotations") or {})
    return Credential(meta.get("namespace", ""), device, device_id, password, revoked)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def enroll(api_client: kubernetes.client.ApiClient, namespace: str, name: str, device_type: str,
           device_id: str | None = None, limit: int | None = None) -> Credential:
    """Create the Device and its credential; refuse a device already enrolled (rotate it instead)."""
    device_id = device_id or name
    core = kubernetes.client.CoreV1Api(api_client)
    if limit is not None:
        enrolled = core.list_namespaced_secret(namespace, label_selector=DEVICE_ID_LABEL).items
        if len(enrolled) >= limit:
            raise EnrollmentError(f"namespace {namespace} has {len(enrolled)} enrolled devices, its limit; revoke "
                                  "and delete one first, or raise the limit")
    password = secrets.token_urlsafe(24)
    secret = {
        "apiVersion": "v1", "kind": "Secret", "type": CREDENTIAL_TYPE,
        "metadata": {"name": secret_name(device_id), "labels": {DEVICE_ID_LABEL: device_id,
                                                               DEVICE_TYPE_LABEL: device_type}},
        "data": {"username": _b64(device_id), "password": _b64(password), "device": _b64(name)},
    }
    try:
        core.create_namespaced_secret(namespace, secret, field_manager=FIELD_MANAGER)
    except kubernetes.client.ApiException as err:
        if err.status == 409:
            raise EnrollmentError(f"device {device_id} is enrolled in {namespace} already (Secret "
                                  f"{secret_name(device_id)}); `corral devices rotate {name}` gives it a new "
                                  "credential") from None
        raise
    device = {"apiVersion": API_VERSION, "kind": "Device",
              "metadata": {"name": name, "labels": {DEVICE_TYPE_LABEL: device_type}},
              "spec": {"deviceId": device_id}}
    try:
        kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "devices", device, field_manager=FIELD_MANAGER)
    except kubernetes.client.ApiException as err:
        if err.status != 409:  # a Device a person made before enrolling it: it stays as it is
            core.delete_namespaced_secret(secret_name(device_id), namespace)
            raise
    return Credential(namespace, name, device_id, password)


def ensure_enrolled(api_client: kubernetes.client.ApiClient, namespace: str, name: str, device_type: str) -> Credential:
    """The device's credential: the one it has (revoked or not), or a new enrollment."""
    try:
        return enroll(api_client, namespace, name, device_type)
    except EnrollmentError:
        current = credential_of(_secret_of(api_client, namespace, name))
        if current is None:
            raise
        return current


def _secret_of(api_client: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The enrollment Secret of the Device `name` (its deviceId decides the Secret's name)."""
    try:
        device = kubernetes.client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "devices", name)
        device_id = (device.get("spec") or {}).get("deviceId") or name
    except kubernetes.client.ApiException as err:
        if err.status != 404:
            raise
        device_id = name
    try:
        secret = kubernetes.client.CoreV1Api(api_client).read_namespaced_secret(secret_name(device_id), namespace)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            raise EnrollmentError(f"device {name} is not enrolled in {namespace} (no Secret "
                                  f"{secret_name(device_id)}): `corral devices enroll {name} --type TYPE`") from None
        raise
    return dict(api_client.sanitize_for_serialization(secret))


def credential_of_device(api_client: kubernetes.client.ApiClient, namespace: str, name: str) -> Credential:
    """The enrolled device's credential (revoked or not)."""
    secret = _secret_of(api_client, namespace, name)
    current = credential_of(secret)
    if current is None:
        raise EnrollmentError(f"Secret {secret['metadata']['name']} is not a Corral device credential")
    return current


def rotate(api_client: kubernetes.client.ApiClient, namespace: str, name: str) -> Credential:
    """A new password; the old one stops working as soon as the controller updates the broker."""
    secret = _secret_of(api_client, namespace, name)
    current = credential_of(secret)
    if current is None:
        raise EnrollmentError(f"Secret {secret['metadata']['name']} is not a Corral device credential")
    password = secrets.token_urlsafe(24)
    kubernetes.client.CoreV1Api(api_client).patch_namespaced_secret(
        secret["metadata"]["name"], namespace, {"data": {"password": _b64(password)}}, field_manager=FIELD_MANAGER)
    return Credential(namespace, current.device, current.device_id, password, current.revoked)


def revoke(api_client: kubernetes.client.ApiClient, namespace: str, name: str) -> Credential:
    """Refuse the device from now on: the controller disables its account, and the broker disconnects it."""
    secret = _secret_of(api_client, namespace, name)
    current = credential_of(secret)
    if current is None:
        raise EnrollmentError(f"Secret {secret['metadata']['name']} is not a Corral device credential")
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kubernetes.client.CoreV1Api(api_client).patch_namespaced_secret(
        secret["metadata"]["name"], namespace, {"metadata": {"annotations": {REVOKED_ANNOTATION: at}}},
        field_manager=FIELD_MANAGER)
    return Credential(namespace, current.device, current.device_id, current.password, revoked=True)
