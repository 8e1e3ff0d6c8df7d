"""`corral audit verify | show`: the audit log, from the controller's HTTPS server or straight from its files.

`--server URL` reads it with your Kubernetes credentials (the kubeconfig's token, or --token): the server
asks the API server who you are (TokenReview) and whether you hold the `audit` verb (SubjectAccessReview).
`--file DIR` reads a copy of the files (the PVC, `.corral/audit` on the local plane). `verify` holds the log
to its newest checkpoint: a file (`--checkpoint`), or the AuditCheckpoint object the controller publishes
(`--checkpoint-object NAMESPACE/NAME`), which someone with API access alone can trust. With
`--against-cluster` it also holds the log to every decision the cluster shows: each Intent's final status
cites its decision record (status.audit), so a tail cut after the newest checkpoint is caught (audit.citations).

Several controller replicas (a StatefulSet) keep one chain each, with its own seq and checkpoints: `--file` and
`--server` repeat, one chain per source. `verify` checks each chain on its own and says per chain OK or where it
breaks (a checkpoint per chain, given in the same order as the sources); `show` merges the records of all chains
by time, each labelled with its chain, so an Intent started by one replica and resumed by another reads as one
story (`--intent` also follows its command id into the Device's records).
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import kubernetes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from corral.api.codes import GROUP, VERSION
from corral.audit.chain import AuditRecord, Verified, digest
from corral.audit.checkpoint import Checkpoint, retained_start, verify_log
from corral.audit.citations import Citation, RetainedLog, check_chains
from corral.audit.keys import public_pem
from corral.audit.log import log_files
from corral.cli.tokenopts import token_options
from corral.client.errors import api_message

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


def _since(since: str | None) -> datetime | None:
    if since is None:
        return None
    match = DURATION.match(since)
    if match is None:
        raise click.BadParameter(f"{since!r}: use a number and s, m, h or d, e.g. 1h", param_hint="--since")
    return datetime.now(UTC) - timedelta(**{UNITS[match.group(2)]: int(match.group(1))})


def _kube(kubeconfig: str | None, context: str | None) -> kubernetes.client.ApiClient:
    try:
        return kubernetes.config.new_client_from_config(config_file=kubeconfig, context=context)
    except (kubernetes.config.ConfigException, OSError) as err:
        raise click.ClickException(f"cannot use the kubeconfig: {err} (set KUBECONFIG or --kubeconfig)") from None


def bearer_of(configuration: kubernetes.client.Configuration) -> str | None:
    """The bearer token a kubeconfig's user sends, if it sends one (not a client certificate)."""
    keys = configuration.api_key or {}
    bearer = str(keys.get("authorization") or keys.get("BearerToken") or "").removeprefix("Bearer ").strip()
    return bearer or None


class Source:
    """Where the log is read from: a directory, or the controller's server with a Kubernetes token."""

    def __init__(self, directory: Path | None, server: str | None, ca_file: str | None, token: str | None,
                 kubeconfig: str | None, context: str | None) -> None:
        if (directory is None) == (server is None):
            raise click.UsageError("give either --file DIR (the log's files) or --server URL (the controller's)")
        self.directory, self.server, self.ca_file = directory, server.rstrip("/") if server else None, ca_file
        self._token, self._kubeconfig, self._context = token, kubeconfig, context

    def token(self) -> str:
        if self._token:
            return self._token
        bearer = bearer_of(_kube(self._kubeconfig, self._context).configuration)
        if not bearer:
            raise click.ClickException("the kubeconfig has no token (a client certificate cannot be passed on): give "
                                       "--token, e.g. one from `kubectl create token`")
        return bearer

    def get(self, path: str, query: dict[str, str] | None = None) -> bytes:
        assert self.server is not None
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        context = ssl.create_default_context(cafile=self.ca_file)
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token()}"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=60) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read()).get("message", "")
            except ValueError:
                message = ""
            raise click.ClickException(f"{self.server} answered {err.code}: {message or err.reason}") from None
        except (urllib.error.URLError, OSError) as err:
            raise click.ClickException(f"cannot reach {self.server}: {err}") from None


class Chain:
    """One audit chain to read: a replica's log, from its files or its server, and the label it is shown by."""

    def __init__(self, source: Source, label: str) -> None:
        self.source, self.label = source, label

    def pieces(self) -> list[tuple[str, list[bytes]]]:
        """The log's lines, per file (or the server's whole log as one piece)."""
        if self.source.directory is not None:
            return [(path.name, path.read_bytes().splitlines()) for path in _files(self.source.directory)]
        return [("the log", self.source.get("/audit/v1/log").splitlines())]


def _chains(directories: tuple[Path, ...], servers: tuple[str, ...], ca_file: str | None, token: str | None,
            kubeconfig: str | None, context: str | None) -> list[Chain]:
    """One chain per --file and per --server, in the order given; labelled by directory name (its path if two
    share a name) or by server host."""
    if not directories and not servers:
        raise click.UsageError("give --file DIR (the log's files) or --server URL (the controller's); repeat either "
                               "for the chains of several replicas")
    sources = [Source(d, None, ca_file, token, kubeconfig, context) for d in directories]
    sources += [Source(None, s, ca_file, token, kubeconfig, context) for s in servers]
    names = [d.name or str(d) for d in directories]
    labels = [str(d) if names.count(n) > 1 else n for d, n in zip(directories, names, strict=True)]
    hosts = [urllib.parse.urlsplit(s).netloc or s for s in servers]
    labels += [s.rstrip("/") if hosts.count(h) > 1 else h for s, h in zip(servers, hosts, strict=True)]
    if len(set(labels)) != len(labels):
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        raise click.UsageError(f"the same chain is given twice: {', '.join(repeated)}")
    return [Chain(source, label) for source, label in zip(sources, labels, strict=True)]


def source_options(command: Any) -> Any:
    for option in reversed([
        click.option("--file", "directories", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     multiple=True, help="The log's directory (a copy of its files); repeat it for one chain per "
                                         "controller replica."),
        click.option("--server", "servers", multiple=True,
                     help="The controller's HTTPS server, e.g. https://corral-controller.corral-system:8443; repeat "
                          "it for one chain per controller replica."),
        click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
                     help="--server: the CA that signed its certificate (default: the system's)."),
        token_options("a Kubernetes bearer token"),
        click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config)."),
        click.option("--context", help="Kubeconfig context to use."),
    ]):
        command = option(command)
    return command


@click.group()
def audit() -> None:
    """The audit log: prove it untouched, read it."""


@audit.command()
@source_options
@click.option("--key", "keys", type=click.Path(exists=True, dir_okay=False, path_type=Path), multiple=True,
              required=True, help="A trusted public key (PEM), named after its file: NAME.pem or NAME.pub.pem signs as NAME.")
@click.option("--checkpoint", "checkpoints", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              multiple=True, help="The newest checkpoint (JSON): without one a cut-off tail cannot be noticed. "
                                  "Several chains: one per chain, in the order of the sources.")
@click.option("--checkpoint-object", "checkpoint_objects", metavar="NAMESPACE/NAME", multiple=True,
              help="The AuditCheckpoint object holding the newest checkpoint (read with the kubeconfig). Several "
                   "chains: one per chain (each replica publishes its own), in the order of the sources.")
@click.option("--max-age", type=float, default=600.0, show_default=True,
              help="Seconds a checkpoint that is not final may be old (twice the controller's interval).")
@click.option("--against-cluster", is_flag=True,
              help="Also check that the log holds, with the same hash, the decision record every Intent's final "
                   "status cites (status.audit): a cut since the newest checkpoint shows (read with the kubeconfig).")
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help="--against-cluster: only Intents in this namespace (repeatable; default all): those of the "
                   "controller whose log this is.")
def verify(directories: tuple[Path, ...], servers: tuple[str, ...], ca_file: str | None, token: str | None,
           kubeconfig: str | None, context: str | None, keys: tuple[Path, ...], checkpoints: tuple[Path, ...],
           checkpoint_objects: tuple[str, ...], max_age: float, against_cluster: bool,
           namespaces: tuple[str, ...]) -> None:
    """Check every record's signature and link, across rotated files; name the first bad record. Several chains
    (one per replica): each on its own, OK or where it breaks."""
    if namespaces and not against_cluster:
        raise click.UsageError("--namespace narrows --against-cluster; give --against-cluster too")
    chains = _chains(directories, servers, ca_file, token, kubeconfig, context)
    trusted = _keys(keys)
    newest = _checkpoints(checkpoints, checkpoint_objects, kubeconfig, context, len(chains))
    # Listed before the log is read: each cited record was on disk before the status citing it was written,
    # so a live log read afterwards holds them all.
    citations = _citations(kubeconfig, context, namespaces) if against_cluster else []
    results = [_verify_chain(chain, trusted, checkpoint, max_age) for chain, checkpoint in zip(chains, newest,
                                                                                               strict=True)]
    broken = [(chain, r) for chain, r in zip(chains, results, strict=True) if isinstance(r, str)]
    verified = [r for r in results if isinstance(r, ChainVerified)]
    cited = ""
    if against_cluster and not broken:
        checked = check_chains(citations, [r.log for r in verified])
        if not checked.ok:
            shown = "\n".join(f"  {p}" for p in checked.problems[:20])
            more = f"\n  ... and {len(checked.problems) - 20} more" if len(checked.problems) > 20 else ""
            ends = ", ".join(f"seq {r.log.last_seq}" for r in verified)
            raise click.ClickException(f"the log does not hold {len(checked.problems)} decision(s) the cluster has "
                                       f"seen (the chain{'s' if len(verified) > 1 else ''} up to {ends} "
                                       f"{'are' if len(verified) > 1 else 'is'} intact):\n{shown}{more}")
        cited = (f"; the decisions of {checked.found} Intent(s) are in it as their status cites them"
                 + (f" ({checked.older} older than the retained log)" if checked.older else ""))
    if len(chains) == 1:
        if broken:
            raise click.ClickException(str(broken[0][1]))
        click.echo(f"OK: {verified[0].summary}{cited}.")
        return
    for chain, result in zip(chains, results, strict=True):
        if isinstance(result, str):
            click.echo(f"chain {chain.label}: BROKEN: {result}")
        else:
            click.echo(f"chain {chain.label}: OK: {result.summary}.")
    if broken:
        raise click.ClickException(f"{len(broken)} of {len(chains)} chains broken: "
                                   f"{', '.join(chain.label for chain, _ in broken)}"
                                   + ("; the cluster's citations were not checked" if against_cluster else ""))
    click.echo(f"OK: {len(chains)} chains, {sum(r.records for r in verified)} records{cited}.")


class ChainVerified:
    """A chain that verified: how many records, what the summary line says, and its hashes for the citations."""

    def __init__(self, records: int, summary: str, log: RetainedLog) -> None:
        self.records, self.summary, self.log = records, summary, log


def _verify_chain(chain: Chain, trusted: dict[str, Ed25519PublicKey], newest: Checkpoint | None,
                  max_age: float) -> ChainVerified | str:
    """One chain on its own (its own seq from 1, its own checkpoint): verified, or where it breaks."""
    pieces = chain.pieces()
    start, missing = retained_start(line for _, lines in pieces for line in lines)
    if missing is not None:
        return f"{pieces[0][0]}, line 1: {missing}"
    total = 0
    for index, (name, lines) in enumerate(pieces):
        last_piece = index == len(pieces) - 1
        verified: Verified = verify_log(lines, trusted, newest if last_piece else None, datetime.now(UTC), max_age,
                                        start)
        if verified.broken is not None:
            return f"{name}, {verified.broken}"
        start, total = verified.last, total + verified.records
    if start is None:  # an empty answer from a server: nothing to vouch for, and a checkpoint would have said so
        return "the log holds no record"
    retained = f" (seq 1-{first - 1} deleted by retention, on record)" if (first := start.seq - total + 1) > 1 else ""
    covered = f", checkpoint {newest.number} covers seq {newest.seq}" if newest is not None else \
        " (no checkpoint given: a cut-off tail would not show)"
    where = f"{len(pieces)} file(s)" if chain.source.directory is not None else chain.source.server
    hashes = [digest(line.rstrip(b"\n")) for _, lines in pieces for line in lines]
    return ChainVerified(total, f"{total} records in {where}, seq {first}-{start.seq}{retained}{covered}",
                         RetainedLog(first, hashes))


def _citations(kubeconfig: str | None, context: str | None, namespaces: tuple[str, ...]) -> list[Citation]:
    """What every final Intent's status cites (status.audit), in the given namespaces or all of them."""
    objects = kubernetes.client.CustomObjectsApi(_kube(kubeconfig, context))
    found: list[Citation] = []
    for namespace in namespaces or (None,):
        token = None
        while True:
            try:
                if namespace is None:
                    page = objects.list_cluster_custom_object(GROUP, VERSION, "intents", limit=500, _continue=token)
                else:
                    page = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, "intents", limit=500,
                                                                 _continue=token)
            except kubernetes.client.ApiException as err:
                raise click.ClickException(f"cannot list Intents{f' in {namespace}' if namespace else ''}: "
                                           f"{err.status} {api_message(err)}") from None
            for item in page.get("items") or []:
                audit = (item.get("status") or {}).get("audit") or {}
                if isinstance(audit.get("seq"), int) and isinstance(audit.get("hash"), str):
                    meta = item["metadata"]
                    found.append(Citation(f"{meta['namespace']}/{meta['name']}", audit["seq"], audit["hash"]))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
    return found


def _checkpoints(paths: tuple[Path, ...], names: tuple[str, ...], kubeconfig: str | None, context: str | None,
                 chains: int) -> list[Checkpoint | None]:
    """The newest checkpoint of each chain, in the order of the sources (None each when none was given)."""
    if paths and names:
        raise click.UsageError("give --checkpoint or --checkpoint-object, not both")
    if not paths and not names:
        return [None] * chains
    given = len(paths) + len(names)
    if given != chains:
        raise click.UsageError(f"{given} checkpoint(s) for {chains} chain(s): give one per chain (each replica "
                               "signs its own), in the order of --file/--server, or none")
    if paths:
        return [_checkpoint(path, None, kubeconfig, context) for path in paths]
    return [_checkpoint(None, name, kubeconfig, context) for name in names]


def _checkpoint(path: Path | None, name: str | None, kubeconfig: str | None, context: str | None) -> Checkpoint | None:
    if path is not None and name is not None:
        raise click.UsageError("give --checkpoint or --checkpoint-object, not both")
    if path is not None:
        raw, where = path.read_bytes(), str(path)
    elif name is not None:
        namespace, _, object_name = name.partition("/")
        if not namespace or not object_name:
            raise click.BadParameter(f"{name!r}: use NAMESPACE/NAME", param_hint="--checkpoint-object")
        objects = kubernetes.client.CustomObjectsApi(_kube(kubeconfig, context))
        try:
            body = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "auditcheckpoints", object_name)
        except kubernetes.client.ApiException as err:
            raise click.ClickException(f"cannot read AuditCheckpoint {name}: {err.status} {api_message(err)}") from None
        if not body.get("spec"):
            raise click.ClickException(f"AuditCheckpoint {name} holds no checkpoint yet")
        raw, where = json.dumps(body["spec"]).encode(), f"AuditCheckpoint {name}"
    else:
        return None
    try:
        return Checkpoint.model_validate_json(raw)
    except ValidationError as err:
        raise click.BadParameter(f"{where}: not a checkpoint ({err.errors()[0]['msg']})",
                                 param_hint="--checkpoint") from None


@audit.command()
@source_options
@click.option("--device", help="Only records about this Device (NAMESPACE/NAME or NAME).")
@click.option("--intent", help="Only records about this Intent (NAMESPACE/NAME or NAME).")
@click.option("--since", help="Only records of the last DURATION: 30s, 15m, 1h, 7d.")
@click.option("--namespace", "-n", help="--server: only records about this namespace (what a Role there may read).")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(directories: tuple[Path, ...], servers: tuple[str, ...], ca_file: str | None, token: str | None,
         kubeconfig: str | None, context: str | None, device: str | None, intent: str | None, since: str | None,
         namespace: str | None, output: str) -> None:
    """Print the records, oldest first (not verified: `corral audit verify` proves them). Several chains: merged by
    time, each record labelled with its chain."""
    chains = _chains(directories, servers, ca_file, token, kubeconfig, context)
    after = _since(since)
    records: list[tuple[int, AuditRecord]] = []
    for index, chain in enumerate(chains):
        records += [(index, r) for r in _records(chain, device, intent, namespace, after)]
    if intent or device:  # records about either, as before; the Intent's with its story across chains
        story = {id(r) for _, r in _story(records, intent)} if intent else set()
        records = [(i, r) for i, r in records if id(r) in story or (device and _about(r, device))]
    if len(chains) > 1:
        records.sort(key=lambda item: (item[1].at, item[0], item[1].seq))
    for index, record in records:
        label = chains[index].label
        if output == "json":
            body = record.model_dump(mode="json", exclude={"sig"})
            click.echo(json.dumps({**body, "chain": label} if len(chains) > 1 else body, ensure_ascii=False))
        else:
            facts = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(record.data.items()))
            where = f"{label} " if len(chains) > 1 else ""
            click.echo(f"{where}{record.seq:>7} {record.at:%Y-%m-%dT%H:%M:%SZ} {record.kind:<16} {record.subject} {facts}")


def _records(chain: Chain, device: str | None, intent: str | None, namespace: str | None,
             after: datetime | None) -> list[AuditRecord]:
    """The chain's records since `after` (a server also narrows them to the device, Intent or namespace)."""
    source = chain.source
    if source.directory is not None:
        lines = [(path.name, line) for path in _files(source.directory) for line in path.read_bytes().splitlines()]
    else:
        query = {k: v for k, v in {"device": device, "intent": intent, "namespace": namespace}.items() if v}
        if after is not None:
            query["since"] = str(max(0.0, (datetime.now(UTC) - after).total_seconds()))
        lines = [("the server's answer", line) for line in source.get("/audit/v1/records", query).splitlines()]
    found = []
    for where, line in lines:
        try:
            record = AuditRecord.model_validate_json(line)
        except ValidationError:
            raise click.ClickException(f"{chain.label}: {where}: a line that is not an audit record; run `corral "
                                       "audit verify`") from None
        if after is None or record.at >= after:
            found.append(record)
    return found


def _about(record: AuditRecord, wanted: str) -> bool:
    return record.subject == wanted or record.subject.endswith("/" + wanted)


def _story(records: list[tuple[int, AuditRecord]], intent: str) -> list[tuple[int, AuditRecord]]:
    """An Intent's records in every chain, and the Device's records of its command id (command.sent, ack.received):
    what each replica did for it, whichever started it and whichever resumed it."""
    own = [r for _, r in records if _about(r, intent)]
    uids = {r.uid for r in own if r.uid}
    command_ids = {str(r.data["commandId"]) for r in own if r.data.get("commandId")}
    return [(i, r) for i, r in records
            if _about(r, intent) or (r.uid is not None and r.uid in uids)
            or (command_ids and str(r.data.get("commandId") or "") in command_ids)]


@audit.command("public-key")
@click.argument("key_file", type=click.File("rb"))
def public_key(key_file: Any) -> None:
    """Print the public half (PEM) of an audit signing key: KEY_FILE, or - for stdin, e.g. from the Secret:

    kubectl get secret corral-audit-keys -o jsonpath='{.data.controller\\.pem}' | base64 -d | corral audit public-key -
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(key_file.read(), password=None)
    except (ValueError, TypeError) as err:
        raise click.ClickException(f"not a PEM private key without a password: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise click.ClickException("not an Ed25519 key (audit logs are signed with Ed25519)")
    click.echo(public_pem(key).decode(), nl=False)
