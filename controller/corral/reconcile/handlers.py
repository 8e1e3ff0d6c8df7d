"""kopf handlers: the controller's only contact with kopf. Each one is a line or two of glue: the lifecycle
(login, startup, cleanup, the probe) and one handler per watched kind, handing its events to the controller.

Only watching handlers (`on.event`) are used: they keep no progress
annotations on the objects, so the controller never writes to a Device's
metadata and its status writes stay the only writes it makes. Every handler
is `async def`: kopf runs plain functions in a thread pool, and everything
the reconcilers own lives on the event loop.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import kopf
import kubernetes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from corral.api.codes import GROUP, VERSION
from corral.audit.keys import AuditKeyError
from corral.audit.log import InUse
from corral.contract.signature import load_public_key
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.kube.typed import Body
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


@dataclass
class _Running:
    """What startup made and cleanup ends."""

    controller: Controller | None = None
    recorder: EventRecorder | None = None


def build_registry(config: ControllerConfig, intent_settings: IntentSettings | None = None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kube = Kube(kubernetes.client.Configuration.get_default_copy())
    running = _Running()
    _lifecycle(registry, config, intent_settings or IntentSettings(), kube, running)
    _watches(registry, running)
    return registry


def _lifecycle(registry: kopf.OperatorRegistry, config: ControllerConfig, intent_settings: IntentSettings, kube: Kube,
               running: _Running) -> None:
    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, logger: kopf.Logger, **kwargs: Any) -> kopf.ConnectionInfo | None:
        # Same credentials as the official client below: kubeconfig, or the in-cluster service account.
        return kopf.login_via_client(settings=settings, logger=logger, **kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        _configure(settings)
        keys = await _signing_keys(kube, config)
        recorder = EventRecorder(kube.create_event)
        try:
            controller = Controller(config, intent_settings, kube, recorder, signing_keys=keys)
            await controller.start()
        except (AuditKeyError, InUse) as err:
            raise kopf.PermanentError(f"the audit log: {err}") from None
        running.controller, running.recorder = controller, recorder

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        controller, recorder = running.controller, running.recorder
        running.controller = running.recorder = None
        if controller is not None:
            await controller.stop()
        if recorder is not None:
            await recorder.close()
        await kube.close()

    @kopf.on.probe(id="mqtt", registry=registry)
    async def mqtt_probe(**_: Any) -> bool:
        return running.controller is not None and running.controller.healthy


# Each watched kind, and the controller's method that maps its events to keys (controller.py says which).
_WATCHED: tuple[tuple[str, Callable[[Controller], Callable[[str, Body], None]]], ...] = (
    ("devices", lambda controller: controller.on_device_event),
    ("intents", lambda controller: controller.on_intent_event),
    ("approvals", lambda controller: controller.on_approval_event),
    ("approvalgrants", lambda controller: controller.on_grant_event),
)


def _watches(registry: kopf.OperatorRegistry, running: _Running) -> None:
    """One handler per watched kind, each handing the event to the controller, which maps it to keys."""
    for plural, deliver in _WATCHED:
        kopf.on.event(GROUP, VERSION, plural, id=f"{plural}-event", registry=registry)(_handing_over(running, deliver))


def _handing_over(running: _Running,
                  deliver: Callable[[Controller], Callable[[str, Body], None]]) -> Callable[..., Awaitable[None]]:
    async def handle(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if running.controller is not None:
            # kopf reports the objects found by its initial listing with event type None.
            deliver(running.controller)(event.get("type") or "ADDED", dict(body))
    return handle


def _configure(settings: kopf.OperatorSettings) -> None:
    settings.peering.standalone = True
    # The resources are known (Corral's own CRDs): no scanning of CRDs or namespaces, which would need
    # list rights the controller's least-privilege role does not have.
    settings.scanning.disabled = True
    settings.posting.enabled = False  # our Events are posted by kube.events, with richer references
    settings.watching.server_timeout = 300
    settings.persistence.diffbase_storage = NoDiffBase()


async def _signing_keys(kube: Kube, config: ControllerConfig) -> dict[str, Ed25519PublicKey]:
    """The public keys contracts may be signed with, from the configured Secret (none configured: none)."""
    if not config.signing_keys_secret:
        return {}
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
    return keys
