"""kopf handlers: the controller's only contact with kopf. Each one is a line or two of glue.

Only watching handlers (`on.event`) are used: they keep no progress
annotations on the objects, so the controller never writes to a Device's
metadata and its status writes stay the only writes it makes. Every handler
is `async def`: kopf runs plain functions in a thread pool, and everything
the reconcilers own lives on the event loop.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import kopf
import kubernetes

from corral.api.codes import GROUP, VERSION
from corral.audit.keys import AuditKeyError
from corral.audit.log import InUse
from corral.contract.signature import load_public_key
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.reconcile.config import ControllerConfig
from corral.reconcile.controller import Controller
from corral.reconcile.intents.reconciler import IntentSettings

log = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """Only watching handlers are registered, and they need no diff base; kopf would otherwise deep-copy
    every object of every event to build one (a third of the controller's CPU under load)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def build_registry(config: ControllerConfig, intent_settings: IntentSettings | None = None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    state: dict[str, Any] = {}
    kube = Kube(kubernetes.client.Configuration.get_default_copy())

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, logger: kopf.Logger, **kwargs: Any) -> kopf.ConnectionInfo | None:
        # Same credentials as the official client below: kubeconfig, or the in-cluster service account.
        return kopf.login_via_client(settings=settings, logger=logger, **kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        # The resources are known (Corral's own CRDs): no scanning of CRDs or namespaces, which would need
        # list rights the controller's least-privilege role does not have.
        settings.scanning.disabled = True
        settings.posting.enabled = False  # our Events are posted by audit.events, with richer references
        settings.watching.server_timeout = 300
        settings.persistence.diffbase_storage = NoDiffBase()
        keys: dict[str, Any] = {}
        if config.signing_keys_secret:
            namespace, _slash, name = config.signing_keys_secret.partition("/")
            try:
                raw = await kube.read_secret_data(namespace, name)
                keys = {key: load_public_key(key, base64.b64decode(value)) for key, value in raw.items()}
            except ApiError as err:
                raise kopf.PermanentError(
                    f"cannot read the signing keys Secret {config.signing_keys_secret}: {err.status} {err.message}"
                ) from None
            except ValueError as err:
                raise kopf.PermanentError(f"Secret {config.signing_keys_secret}: {err}") from None
            if not keys:
                raise kopf.PermanentError(f"Secret {config.signing_keys_secret} holds no signing keys")
            log.info("trusting %d contract signing key(s) from %s", len(keys), config.signing_keys_secret)
        recorder = EventRecorder(kube.create_event)
        try:
            controller = Controller(config, intent_settings or IntentSettings(), kube, recorder, signing_keys=keys)
            await controller.start()
        except (AuditKeyError, InUse) as err:
            raise kopf.PermanentError(f"the audit log: {err}") from None
        state["controller"] = controller
        state["recorder"] = recorder

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        controller = state.pop("controller", None)
        if controller is not None:
            await controller.stop()
        recorder = state.pop("recorder", None)
        if recorder is not None:
            await recorder.close()
        await kube.close()

    # kopf reports the objects found by its initial listing with event type None.
    @kopf.on.event(GROUP, VERSION, "devices", registry=registry)
    async def device_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        controller = state.get("controller")
        if controller is not None:
            controller.on_device_event(event.get("type") or "ADDED", dict(body))

    @kopf.on.event(GROUP, VERSION, "intents", registry=registry)
    async def intent_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        controller = state.get("controller")
        if controller is not None:
            controller.on_intent_event(event.get("type") or "ADDED", dict(body))

    @kopf.on.event(GROUP, VERSION, "approvals", registry=registry)
    async def approval_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        controller = state.get("controller")
        if controller is not None:
            controller.on_approval_event(event.get("type") or "ADDED", dict(body))

    @kopf.on.event(GROUP, VERSION, "approvalgrants", registry=registry)
    async def grant_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        controller = state.get("controller")
        if controller is not None:
            controller.on_grant_event(event.get("type") or "ADDED", dict(body))

    @kopf.on.probe(id="mqtt", registry=registry)
    async def mqtt_probe(**_: Any) -> bool:
        controller = state.get("controller")
        return controller is not None and controller.healthy

    return registry
