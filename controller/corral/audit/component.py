"""A component's audit log, opened with its key and its checkpoint signer: the gateway's, here.

The controller assembles the same parts itself (reconcile.controller), as it also reads its decisions back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import kubernetes

from corral.audit.keys import load_private_key, public_pem
from corral.audit.log import AuditLog
from corral.audit.signer import DEFAULT_INTERVAL_S, CheckpointSigner, Retention, publisher
from corral.client.asyncapi import AsyncApi


@dataclass(frozen=True)
class AuditSettings:
    directory: Path
    key_file: Path
    key_name: str
    create_key: bool = True
    checkpoint: str | None = None  # "namespace/name" of the AuditCheckpoint object
    interval_s: float = DEFAULT_INTERVAL_S


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
    """Open the log (blocking: call it before serving). `config`: whose credentials publish the checkpoints."""
    key = load_private_key(settings.key_file, create=settings.create_key)
    log = AuditLog(settings.directory, settings.key_name, key)
    log.open()
    public = settings.directory / f"{settings.key_name}.pub.pem"
    if not public.exists() or public.read_bytes() != public_pem(key):
        public.write_bytes(public_pem(key))
    api, publish = None, None
    if settings.checkpoint and config is not None:
        namespace, _, name = settings.checkpoint.partition("/")
        api = AsyncApi(config, connections=2)
        publish = publisher(api, namespace, name, manager)
    return Audit(log, CheckpointSigner(log, settings.interval_s, publish, Retention()), api)
