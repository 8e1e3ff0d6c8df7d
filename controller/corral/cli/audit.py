"""`corral audit verify | show --file DIR`: the audit log read straight from its files.

Reading it over the controller's HTTPS server with Kubernetes credentials comes with the rest of issue 16;
these work wherever the files are (a copy of the PVC, `.corral/` on the local plane).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from corral.audit.chain import AuditRecord, Chain, Verified
from corral.audit.checkpoint import Checkpoint, verify_log
from corral.audit.log import log_files

DURATION = re.compile(r"^(\d+)([smhd])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _keys(paths: tuple[Path, ...]) -> dict[str, Ed25519PublicKey]:
    """Trusted keys, each named after its file (without .pem or .pub.pem), as records name theirs."""
    keys = {}
    for path in paths:
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except (ValueError, OSError) as err:
            raise click.BadParameter(f"{path}: not a PEM public key ({err})", param_hint="--key") from None
        if not isinstance(key, Ed25519PublicKey):
            raise click.BadParameter(f"{path}: not an Ed25519 key", param_hint="--key")
        keys[path.stem.removesuffix(".pub")] = key
    return keys


def _files(directory: Path) -> list[Path]:
    files = log_files(directory)
    if not files:
        raise click.ClickException(f"no audit log in {directory} (files audit-NNNNNN.jsonl)")
    return files


@click.group()
def audit() -> None:
    """The audit log: prove it untouched, read it."""


@audit.command()
@click.option("--file", "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="The log's directory.")
@click.option("--key", "keys", type=click.Path(exists=True, dir_okay=False, path_type=Path), multiple=True,
              required=True, help="A trusted public key (PEM), named after its file: NAME.pem or NAME.pub.pem signs as NAME.")
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The newest checkpoint (JSON): without it a cut-off tail cannot be noticed.")
@click.option("--max-age", type=float, default=600.0, show_default=True,
              help="Seconds a checkpoint that is not final may be old (twice the controller's interval).")
def verify(directory: Path, keys: tuple[Path, ...], checkpoint: Path | None, max_age: float) -> None:
    """Check every record's signature and link, across rotated files; name the first bad record."""
    trusted = _keys(keys)
    newest = None
    if checkpoint is not None:
        try:
            newest = Checkpoint.model_validate_json(checkpoint.read_bytes())
        except ValidationError as err:
            raise click.BadParameter(f"{checkpoint}: not a checkpoint ({err.errors()[0]['msg']})",
                                     param_hint="--checkpoint") from None
    files = _files(directory)
    start: Chain | None = None
    total = 0
    for index, path in enumerate(files):
        last_file = index == len(files) - 1
        verified: Verified = verify_log(path.read_bytes().splitlines(), trusted, newest if last_file else None,
                                        datetime.now(UTC), max_age, start)
        if verified.broken is not None:
            raise click.ClickException(f"{path.name}, {verified.broken}")
        start, total = verified.last, total + verified.records
    assert start is not None
    covered = f", checkpoint {newest.number} covers seq {newest.seq}" if newest is not None else \
        " (no checkpoint given: a cut-off tail would not show)"
    click.echo(f"OK: {total} records in {len(files)} file(s), seq 1-{start.seq}{covered}.")


@audit.command()
@click.option("--file", "directory", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="The log's directory.")
@click.option("--device", help="Only records about this Device (NAMESPACE/NAME or NAME).")
@click.option("--intent", help="Only records about this Intent (NAMESPACE/NAME or NAME).")
@click.option("--since", help="Only records of the last DURATION: 30s, 15m, 1h, 7d.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(directory: Path, device: str | None, intent: str | None, since: str | None, output: str) -> None:
    """Print the records, oldest first (not verified: `corral audit verify` proves them)."""
    after = None
    if since is not None:
        match = DURATION.match(since)
        if match is None:
            raise click.BadParameter(f"{since!r}: use a number and s, m, h or d, e.g. 1h", param_hint="--since")
        after = datetime.now(UTC) - timedelta(**{UNITS[match.group(2)]: int(match.group(1))})
    wanted = [w for w in (device, intent) if w]
    for path in _files(directory):
        for line in path.read_bytes().splitlines():
            try:
                record = AuditRecord.model_validate_json(line)
            except ValidationError:
                raise click.ClickException(f"{path.name}: a line that is not an audit record; run "
                                           "`corral audit verify`") from None
            if after is not None and record.at < after:
                continue
            if wanted and not any(record.subject == w or record.subject.endswith("/" + w) for w in wanted):
                continue
            if output == "json":
                click.echo(json.dumps(record.model_dump(mode="json", exclude={"sig"}), ensure_ascii=False))
            else:
                facts = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(record.data.items()))
                click.echo(f"{record.seq:>7} {record.at:%Y-%m-%dT%H:%M:%SZ} {record.kind:<16} {record.subject} {facts}")
