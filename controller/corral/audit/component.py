"""A component's audit log and its checkpoint signer, assembled from settings: the controller's and the
gateway's are made the same way (the controller also reads its decisions back, reconcile.controller)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import kubernetes

from corral.audit.keys import load_private_key
from corral.audit.log import DEFAULT_MAX_BYTES, AuditLog
from corral.audit.signer import DEFAULT_INTERVAL_S, CheckpointSigner, Retention, publisher
from corral.kube.client import AsyncApi


@dataclass(frozen=True)
class AuditSettings:
    directory: Path
    key_file: Path
    key_name: str
    create_key: bool = True
    checkpoint: str | None = None  # "namespace/name" of the AuditCheckpoint object
    interval_s: float = DEFAULT_INTERVAL_S
    max_bytes: int = DEFAULT_MAX_BYTES
    max_file_age_s: float | None = 86400.0
    retention: Retention = field(default_factory=Retention)


def assemble(settings: AuditSettings, api: AsyncApi | None, manager: str) -> tuple[AuditLog, CheckpointSigner]:
    """The log (not opened yet) and its signer; checkpoints are published with `api` when there is an object."""
    key = load_private_key(settings.key_file, create=settings.create_key)
    log = AuditLog(settings.directory, settings.key_name, key, max_bytes=settings.max_bytes,
                   max_file_age_s=settings.max_file_age_s)
    publish = None
    if settings.checkpoint and api is not None:
        namespace, _, name = settings.checkpoint.partition("/")
        publish = publisher(api, namespace, name, manager)
    return log, CheckpointSigner(log, settings.interval_s, publish, settings.retention)


@dataclass
class Audit:
    log: AuditLog
    signer: CheckpointSigner
    api: AsyncApi | None

    async def start(self) -> None:
        self.signer.start()

    async def stop(self) -> None:
        await self.signer.stop()
        self.log.close()
        if self.api is not None:
            await self.api.close()


def open_audit(settings: AuditSettings, config: kubernetes.client.Configuration | None, manager: str) -> Audit:
    """Assemble and open the log (blocking: call it before serving). `config`: whose credentials publish the
    checkpoints."""
    api = AsyncApi(config, connections=2) if settings.checkpoint and config is not None else None
    log, signer = assemble(settings, api, manager)
    log.open()
    return Audit(log, signer, api)
