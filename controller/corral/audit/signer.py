"""Signing checkpoints while a component runs: every interval and once more, final, when it stops.

Each checkpoint is appended to `checkpoints.jsonl` beside the log (so the next one, after a restart too,
chains to it) and then published as the component's AuditCheckpoint object, replaced with a plain
update: the gateway's one Kubernetes right is `get` and `update` on that one object. A checkpoint that
could not be published is logged and superseded by the next; the log itself never waits for the API.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.audit.checkpoint import Checkpoint, sign_checkpoint
from corral.audit.log import AuditLog
from corral.kube.client import ApiError, AsyncApi, path_of

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints.jsonl"
DEFAULT_INTERVAL_S = 300.0

Publish = Callable[[Checkpoint], Awaitable[dict[str, Any] | None]]


# The log's default total size: 1 GiB holds some two million records, years of a home's decisions and state
# changes, yet fits a small disk; beyond it the oldest closed files go, on record (audit.retention). A device's
# flood cannot push older records out: its messages are counted, not recorded one by one (devices.limits).
MAX_TOTAL_BYTES = 2**30


@dataclass(frozen=True)
class Retention:
    """How long closed log files are kept (by their last write), and how much of them in all; None: no limit."""

    max_age_s: float | None = 365 * 86400.0
    max_total_bytes: int | None = MAX_TOTAL_BYTES


def last_checkpoint(directory: Path) -> Checkpoint | None:
    path = directory / CHECKPOINTS
    if not path.exists():
        return None
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            return Checkpoint.model_validate_json(line)
        except ValueError:
            continue  # a torn last line: the one before it was the last complete
    return None


class CheckpointSigner:
    def __init__(self, audit: AuditLog, interval_s: float = DEFAULT_INTERVAL_S, publish: Publish | None = None,
                 retention: Retention | None = None) -> None:
        self.audit = audit
        self.retention = retention
        self.interval_s = interval_s
        self.publish = publish
        self.last = last_checkpoint(audit.directory)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="audit-checkpoints")

    async def stop(self) -> None:
        """Sign the final checkpoint: nothing may follow it in the log."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.sign(final=True)

    async def _run(self) -> None:
        while True:
            try:
                if self.retention is not None and self.audit.writable:
                    await self.audit.retain(self.retention.max_age_s, self.retention.max_total_bytes)
                await self.sign()
            except Exception:
                log.exception("could not sign an audit checkpoint")
            await asyncio.sleep(self.interval_s)

    async def sign(self, final: bool = False) -> Checkpoint | None:
        await self.audit.flush()
        if not self.audit.writable:
            return None  # what it would cover is not all on disk; the log's own recovery comes first
        number = self.last.number + 1 if self.last is not None else 1
        checkpoint = sign_checkpoint(self.audit.chain, number, datetime.now(UTC).replace(microsecond=0), self.last,
                                     self.audit.key_name, self.audit.key, final=final)
        await asyncio.to_thread(self._keep, checkpoint)
        self.last = checkpoint
        if self.publish is not None:
            try:
                written = await self.publish(checkpoint)
            except (ApiError, OSError) as err:
                log.warning("audit checkpoint %d is signed but could not be published: %s", number, err)
            else:
                if written is not None and not final:
                    meta = written.get("metadata") or {}
                    # The object's generation only moves on: someone who puts an older checkpoint back moves it
                    # past what the log says it was.
                    self.audit.note("checkpoint.published", "audit", {
                        "number": number, "seq": checkpoint.seq, "object": meta.get("name"),
                        "uid": meta.get("uid"), "generation": meta.get("generation")})
        return checkpoint

    def _keep(self, checkpoint: Checkpoint) -> None:
        fd = os.open(self.audit.directory / CHECKPOINTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, checkpoint.model_dump_json().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)


def publisher(api: AsyncApi, namespace: str, name: str, manager: str) -> Publish:
    """Replace the AuditCheckpoint object's spec (create it when it does not exist and we may)."""
    path = path_of(GROUP, VERSION, "auditcheckpoints", namespace, name)

    async def publish(checkpoint: Checkpoint) -> dict[str, Any] | None:
        spec = checkpoint.model_dump(mode="json")
        try:
            current = await api.request("GET", path)
        except ApiError as err:
            if err.status != 404:
                raise
            body = {"apiVersion": API_VERSION, "kind": "AuditCheckpoint",
                    "metadata": {"name": name, "namespace": namespace}, "spec": spec}
            return await api.request("POST", path_of(GROUP, VERSION, "auditcheckpoints", namespace), body=body,
                                     params={"fieldManager": manager})
        current["spec"] = spec
        return await api.request("PUT", path, body=current, params={"fieldManager": manager})

    return publish
