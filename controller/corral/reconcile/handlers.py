"""kopf handlers: the controller's only contact with kopf. Each one is a line or two of glue.

Only watching handlers (`on.event`) are used: they keep no progress
annotations on the objects, so the controller never writes to a Device's
metadata and its status writes stay the only writes it makes.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import kopf
import kubernetes

from corral.api.base import GROUP, VERSION
from corral.audit.events import EventRecorder
from corral.contract.signature import load_public_key
from corral.reconcile.config import ControllerConfig
from corral.reconcile.controller import DeviceController
from corral.reconcile.intents import IntentController, IntentSettings
from corral.reconcile.kube import Kube

log = logging.getLogger(__name__)


def build_registry(config: ControllerConfig, intent_settings: IntentSettings | None = None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    state: dict[str, Any] = {}

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
        api_client = kubernetes.client.ApiClient()
        kube = Kube(api_client)
        keys = {}
        if config.signing_keys_secret:
            namespace, _, name = config.signing_keys_secret.partition("/")
            try:
                raw = await kube.read_secret_data(namespace, name)
                keys = {key: load_public_key(key, base64.b64decode(value)) for key, value in raw.items()}
            except kubernetes.client.ApiException as err:
                raise kopf.PermanentError(
                    f"cannot read the signing keys Secret {config.signing_keys_secret}: {err.status} {err.reason}"
                ) from None
            except ValueError as err:
                raise kopf.PermanentError(f"Secret {config.signing_keys_secret}: {err}") from None
            if not keys:
                raise kopf.PermanentError(f"Secret {config.signing_keys_secret} holds no signing keys")
            log.info("trusting %d contract signing key(s) from %s", len(keys), config.signing_keys_secret)
        recorder = EventRecorder(api_client)
        controller = DeviceController(config, kube, recorder, signing_keys=keys)
        intents = IntentController(intent_settings or IntentSettings(), kube, recorder, controller)
        await controller.start()
        await intents.start()
        state["controller"] = controller
        state["intents"] = intents
        state["recorder"] = recorder

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        intents = state.pop("intents", None)
        if intents is not None:
            await intents.stop()
        controller = state.pop("controller", None)
        if controller is not None:
            await controller.stop()
        recorder = state.pop("recorder", None)
        if recorder is not None:
            await recorder.close()

    @kopf.on.event(GROUP, VERSION, "devices", registry=registry)
    def device_event(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
        controller = state.get("controller")
        if controller is not None:
            # kopf reports the objects found by its initial listing with type None.
            controller.on_device_event(event.get("type") or "ADDED", dict(body))

    @kopf.on.event(GROUP, VERSION, "intents", registry=registry)
    def intent_event(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
        intents = state.get("intents")
        if intents is not None:
            intents.on_intent_event(event.get("type") or "ADDED", dict(body))

    @kopf.on.event(GROUP, VERSION, "approvals", registry=registry)
    def approval_event(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
        intents = state.get("intents")
        if intents is not None:
            intents.on_approval_event(event.get("type") or "ADDED", dict(body))

    @kopf.on.probe(id="mqtt", registry=registry)
    def mqtt_probe(**_: Any) -> bool:
        controller = state.get("controller")
        return controller is not None and controller.link.connected.is_set()

    return registry
