"""`corral run`: the controller."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import signal
import socket
from datetime import timedelta

import click
import kopf
import kubernetes
from kopf._core.engines.peering import Identity  # kopf exports no public name for it: a NewType of str

from corral.api.codes import PEOPLE_NAMESPACE
from corral.audit.signer import MAX_TOTAL_BYTES, Retention
from corral.cli.mqttopts import broker_password, password_file_option
from corral.cli.obsopts import LOOPBACK, observability_options
from corral.cli.secrets import IN_CLUSTER_NAMESPACE
from corral.contract.trust import RiskFloors
from corral.decide.approvals import People, people_of
from corral.decide.decision import Policy
from corral.decide.ratelimit import RateLimit
from corral.devices.limits import DEFAULT_BURST, DEFAULT_RATE
from corral.devices.telemetry import Coalescing
from corral.history.model import Retention as HistoryRetention
from corral.notify.payloads import NotifySettings, check_url
from corral.notify.sender import load_config as load_notify_config
from corral.reconcile.config import ControllerConfig
from corral.reconcile.handlers import build_registry
from corral.reconcile.intents.settings import IntentSettings
from corral.scale.settings import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S, ScaleSettings
from corral.serving.frontproxy import FRONT_PROXY_CLIENT, GROUP_HEADERS, USERNAME_HEADERS, FrontProxy

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A StatefulSet pod's ordinal, which names its history file; what else an --identity may hold is no file name.
ORDINAL = re.compile(r"-(\d+)$")
FILE_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# Where kube-apiserver publishes how it authenticates to aggregated API servers (namespace, name).
AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")


@click.command()
@observability_options("corral-controller", host_option="listen_host")
@click.option("--mqtt", "mqtt_url", envvar="CORRAL_MQTT_URL", required=True,
              help="Broker URL with the controller's username and no password: mqtt://corral-controller@host:1883 or "
                   "mqtts://corral-controller@host:8883 (env CORRAL_MQTT_URL). A URL with a password is refused: "
                   "use --mqtt-password-file.")
@password_file_option
@click.option("--mqtt-ca", "mqtt_ca", envvar="CORRAL_MQTT_CA", type=click.Path(dir_okay=False, exists=True),
              help="mqtts://: the CA file that signed the broker's certificate (default: the system's; env CORRAL_MQTT_CA).")
@click.option("--mqtt-cert", type=click.Path(dir_okay=False, exists=True),
              help="mqtts://: the controller's client certificate, for brokers that authenticate by certificate.")
@click.option("--mqtt-key", type=click.Path(dir_okay=False, exists=True), help="The key of --mqtt-cert.")
@click.option("--no-broker-accounts", is_flag=True,
              help="Do not manage the broker's device accounts (a broker Corral does not manage; docs/device-trust.md).")
@click.option("--max-devices-per-namespace", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Enrolled devices a namespace may have; beyond it, enrollments get no broker account.")
@click.option("--watch-namespace", "watch_namespaces", multiple=True, metavar="NS",
              help="Only watch Devices in these namespaces (repeatable); default: all namespaces.")
@click.option("--bridge-namespace", "bridge_namespaces", multiple=True, metavar="NS",
              help="The only namespaces whose bridge and source Secrets (corral bridge add-account|add-source) make "
                   "broker accounts (repeatable); one elsewhere is refused, with a Warning Event on it. Default: the "
                   "namespace the controller runs in (env POD_NAMESPACE, or its ServiceAccount's), else none.")
@click.option("--topic-prefix", default="iot", show_default=True, help="MQTT topic prefix.")
@click.option("--command-timeout", type=float, default=5.0, show_default=True, help="Seconds to wait for an ack.")
@click.option("--heartbeat-interval", type=click.FloatRange(min=0.1, max=600), default=2.0, show_default=True,
              help="Seconds between heartbeats on PREFIX/_corral/heartbeat, which device failsafes count from; "
                   "keep it well below the shortest failsafe delay.")
@click.option("--redrive-max-age", type=click.FloatRange(min=0), default=3600.0, show_default=True,
              help="After a device failsafe, targets set longer ago than this many seconds are not driven again "
                   "by themselves (condition Failsafe, reason TargetTooOld): a person re-applies them.")
@click.option("--status-interval", type=float, default=10.0, show_default=True,
              help="At most one sensor status write per device per this many seconds.")
@click.option("--deadband", "deadbands", multiple=True, metavar="METRIC=VALUE",
              help="Absolute change of a metric that is written sooner than the interval (repeatable); "
                   "default: 2% of the sensor's range.")
@click.option("--device-message-rate", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_RATE,
              show_default=True, help="Event and telemetry messages (and changed contracts) a second each device may send, "
                                      "sustained; beyond it they are dropped and counted (device.flooding records, "
                                      "Flooding Events).")
@click.option("--device-message-burst", type=click.IntRange(min=1), default=DEFAULT_BURST, show_default=True,
              help="How many of them a device may send at once before --device-message-rate applies.")
@click.option("--broker-log", envvar="CORRAL_BROKER_LOG", type=click.Path(dir_okay=False), metavar="FILE",
              help="Mosquitto's log with `log_type debug` (the local plane's; env CORRAL_BROKER_LOG): its refused "
                   "PUBLISHes are counted per device, recorded (device.refused) and told in Warning Events; the "
                   "file is cut once 8 MiB of it are read.")
@click.option("--approvals", "approvals", multiple=True, metavar="RISK=N",
              help="Approvals an Intent of this risk needs (repeatable); default low=0 medium=1 high=1 critical=1.")
@click.option("--freshness", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="Seconds a sensor reading an Intent relies on (basedOn) may be old, for sensors whose contract "
                   "declares no publish interval (otherwise 2.5 x the interval, up to --freshness-cap).")
@click.option("--freshness-cap", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="The most seconds a declared publish interval may make a cited reading's limit: a device cannot "
                   "make old data fresh by declaring a long interval. A person's spec.freshness on a Device is not "
                   "capped.")
@click.option("--approval-window", type=float, default=300.0, show_default=True,
              help="Seconds an Intent waits for approval, and an approval stays good.")
@click.option("--rate-limit", "rate_limit", default="30/60", show_default=True, metavar="CALLS/SECONDS",
              callback=lambda _ctx, _param, text: _rate_limit(text),  # refused before anything runs
              help="Per requester: at most CALLS Intents that act on devices at once, refilled at CALLS per SECONDS "
                   "(the gateway's rule, enforced here too for Intents made straight at the API server); beyond it "
                   "they end RATE_LIMITED. CALLS/min is CALLS/60; 0/60 for no limit.")
@click.option("--people-namespace", default=PEOPLE_NAMESPACE, show_default=True, metavar="NS",
              help="ServiceAccounts in this namespace are people and may approve; other ServiceAccounts are programs, "
                   "which never approve (Users always may, with the approve verb). Keep agents' roles out of it.")
@click.option("--approver-service-account", "approver_service_accounts", multiple=True, metavar="NS/NAME",
              help="A ServiceAccount outside --people-namespace that may approve anyway (repeatable). Each one weakens "
                   "the two-person rule: whatever holds its token approves like a person.")
@click.option("--contract-hold-window", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Seconds an Intent on a held Device (a changed contract nobody accepted yet) waits before it is "
                   "denied with DENY_CONTRACT_HOLD.")
@click.option("--risk-floor", "risk_floors", multiple=True, metavar="MODEL[/ACTUATOR]=RISK",
              help="The least risk actions of this device model (or one of its actuators) have, whatever its "
                   "contract says (repeatable); device:NAMESPACE/NAME[/ACTUATOR]=RISK for one Device.")
@click.option("--capability-grace", type=click.FloatRange(min=1), default=3600.0, show_default=True,
              help="Seconds before a Capability no Device uses is deleted (only when watching all namespaces).")
@click.option("--intent-timeout", type=float, default=10.0, show_default=True,
              help="Seconds to wait for the device to report an executed Intent's value.")
@click.option("--intent-retention", type=click.FloatRange(min=0), default=3600.0, show_default=True,
              help="Seconds a finished Intent is kept after it was decided, then deleted (as a Job's "
                   "ttlSecondsAfterFinished; a dry run's, 600); its records stay in the audit log, and a replay of its "
                   "name is answered from there for --idempotency-window.")
# The name before 1 h became the default; kept so that existing command lines and charts still start.
@click.option("--intent-ttl", type=click.FloatRange(min=0), hidden=True,
              help="Deprecated: --intent-retention.")
@click.option("--idempotency-window", type=click.FloatRange(min=1), default=86400.0, show_default=True,
              help="Seconds after an Intent was decided during which a new Intent of the same name is answered from "
                   "the audit log, without running: DEDUP with the earlier outcome for the same request, "
                   "DENY_ID_CONFLICT for another; also the least age of audit files retention deletes (only "
                   "--audit-max-total-bytes can delete younger ones).")
@click.option("--health-port", type=int, default=8080, show_default=True,
              help="Port of /healthz (liveness and readiness); 0 turns it off.")
@click.option("--listen-host", default=LOOPBACK, show_default=True, metavar="ADDRESS",
              help="Address the health port, the HTTPS reader (--serve-port) and /metrics listen on; 0.0.0.0 in a Pod, "
                   "where the kubelet, the API server and Prometheus reach them over the network.")
@click.option("--require-signatures", is_flag=True, help="Refuse contracts without a valid Ed25519 signature.")
@click.option("--signing-keys", metavar="NAMESPACE/SECRET",
              help="Secret whose data entries are the trusted contract signing public keys.")
@click.option("--audit-dir", envvar="CORRAL_AUDIT_DIR", default=".corral/audit", show_default=True,
              type=click.Path(file_okay=False), help="Directory of the audit log (a PersistentVolume in the chart).")
@click.option("--audit-key", envvar="CORRAL_AUDIT_KEY", default=".corral/audit-keys/controller.pem",
              show_default=True, type=click.Path(dir_okay=False),
              help="The Ed25519 private key (PEM) that signs the audit log and its checkpoints; made there if missing "
                   "unless --no-create-audit-key. Its public half is written into --audit-dir as NAME.pub.pem.")
@click.option("--audit-key-name", default="controller", show_default=True,
              help="The name records give their key: `corral audit verify --key NAME.pem`.")
@click.option("--no-create-audit-key", is_flag=True, help="Refuse to start without the key (the chart mounts a Secret).")
@click.option("--audit-checkpoint", metavar="NAMESPACE/NAME",
              help="The AuditCheckpoint object the signed checkpoints are published to.")
@click.option("--audit-checkpoint-interval", type=click.FloatRange(min=0.5), default=300.0, show_default=True,
              help="Seconds between checkpoints; `corral audit verify --max-age` should be twice this.")
@click.option("--audit-max-bytes", type=click.IntRange(min=4096), default=64 * 2**20, show_default=True,
              help="An audit log file this large is closed and the next one continues the chain.")
@click.option("--audit-retention-days", type=click.FloatRange(min=0, min_open=True), default=365.0, show_default=True,
              help="Closed audit log files last written longer ago are deleted, on record (audit.retention).")
@click.option("--audit-max-total-bytes", type=click.IntRange(min=0), default=MAX_TOTAL_BYTES,
              show_default=True, help="The oldest closed files are deleted (on record) while the log is larger; 0: no "
                                      "limit.")
# The history of samples (reconcile/history.py): opt-in, a file per replica on a volume of its own.
@click.option("--history-dir", envvar="CORRAL_HISTORY_DIR", type=click.Path(file_okay=False),
              help="Keep every telemetry sample in an SQLite file here, history-<ordinal or --identity>.sqlite3 (one per "
                   "replica), served at .../devices/NAME/history; without it, only the last minutes are kept, in memory.")
@click.option("--history-raw-days", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Days raw samples are kept; 5-minute rollups are kept 90 days and hourly ones 2 years.")
@click.option("--history-max-bytes", type=click.IntRange(min=1 << 20), metavar="BYTES",
              help="The most the history file may take; beyond it the oldest is dropped (raw samples first, then "
                   "5-minute, then hourly rollups). Default: no bound but retention.")
@click.option("--serve-port", type=click.IntRange(min=0, max=65535), default=8443, show_default=True,
              help="HTTPS port of the audit log's reader (Kubernetes tokens, the `audit` verb); 0 turns it off.")
@click.option("--serve-cert", type=click.Path(dir_okay=False, exists=True),
              help="Its certificate (PEM); without one, a certificate for localhost is made beside --audit-key.")
@click.option("--serve-key", type=click.Path(dir_okay=False, exists=True), help="The key of --serve-cert.")
@click.option("--requestheader-client-ca-file", type=click.Path(dir_okay=False, exists=True),
              help="The aggregation layer's requestheader CA (kube-apiserver's flag of that name): a request through "
                   "the readings APIService names its caller in X-Remote-User/X-Remote-Group, believed only over a "
                   "client certificate this CA signed. Without it (or --requestheader-from-cluster) such headers are "
                   "refused.")
@click.option("--requestheader-allowed-names", default=FRONT_PROXY_CLIENT, show_default=True, metavar="NAMES",
              help="Common names that certificate may have (comma-separated; empty: any the CA signed). With "
                   "--requestheader-from-cluster, the cluster's own list is used instead.")
@click.option("--requestheader-from-cluster", is_flag=True,
              help="Read the requestheader CA, allowed names and headers at start from the ConfigMap "
                   f"{AUTH_CONFIGMAP[0]}/{AUTH_CONFIGMAP[1]}, where kube-apiserver publishes them (needs the Role "
                   "extension-apiserver-authentication-reader there; the chart binds it).")
# Approval requests to webhooks (notify/sender.py, docs/controller.md "Notifications").
@click.option("--notify-config", type=click.Path(dir_okay=False, exists=True),
              help="YAML or JSON file of webhooks (ntfy, slack, json) told when an Intent starts waiting for approval; "
                   "their URLs and headers may come from files (a mounted Secret).")
@click.option("--console-url", metavar="URL",
              help="Base URL of the approval console: notifications link to URL/intents/NAMESPACE/NAME.")
# Leader election and sharding (docs/scale.md): off, the controller stands alone and owns every device.
@click.option("--leader-elect", is_flag=True,
              help="Run as one of several replicas: act only for the devices of the shards whose Leases "
                   "(coordination.k8s.io) this replica holds; the others wait warm. The holder of shard 0 leads.")
@click.option("--identity", metavar="ID",
              help="This replica's name in the Leases; default $POD_NAME (or the hostname) plus '_' and 8 random hex "
                   "digits, so a restarted container is another holder.")
@click.option("--lease-namespace", envvar="POD_NAMESPACE", default="default", show_default=True, metavar="NS",
              help="Namespace of the Leases (env POD_NAMESPACE: the release's).")
@click.option("--lease-prefix", default="corral-controller", show_default=True,
              help="Leases are PREFIX-shard-K and PREFIX-member-POD.")
@click.option("--shards", type=click.IntRange(min=1), default=1, show_default=True,
              help="Virtual shards the devices are divided into, each held through its own Lease; 1 is plain "
                   "active/standby. Every replica must be given the same number.")
@click.option("--lease-duration", type=click.FloatRange(min=0, min_open=True), default=LEASE_DURATION_S,
              show_default=True, help="Seconds a Lease is its holder's after its last renewal.")
@click.option("--renew-deadline", type=click.FloatRange(min=0, min_open=True), default=RENEW_DEADLINE_S,
              show_default=True, help="Seconds after its last successful renewal that a holder stops acting (no "
                                      "command, no status write); less than --lease-duration.")
@click.option("--retry-period", type=click.FloatRange(min=0, min_open=True), default=RETRY_PERIOD_S,
              show_default=True, help="Seconds between attempts to acquire or renew; less than --renew-deadline.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def run(
    mqtt_url: str,
    mqtt_password_file: str | None,
    mqtt_ca: str | None,
    mqtt_cert: str | None,
    mqtt_key: str | None,
    no_broker_accounts: bool,
    max_devices_per_namespace: int,
    watch_namespaces: tuple[str, ...],
    bridge_namespaces: tuple[str, ...],
    topic_prefix: str,
    command_timeout: float,
    heartbeat_interval: float,
    redrive_max_age: float,
    status_interval: float,
    deadbands: tuple[str, ...],
    device_message_rate: float,
    device_message_burst: int,
    broker_log: str | None,
    approvals: tuple[str, ...],
    freshness: float,
    freshness_cap: float,
    approval_window: float,
    rate_limit: RateLimit,
    people_namespace: str,
    approver_service_accounts: tuple[str, ...],
    contract_hold_window: float,
    risk_floors: tuple[str, ...],
    capability_grace: float,
    intent_timeout: float,
    intent_retention: float,
    intent_ttl: float | None,
    idempotency_window: float,
    health_port: int,
    listen_host: str,
    require_signatures: bool,
    signing_keys: str | None,
    audit_dir: str,
    audit_key: str,
    audit_key_name: str,
    no_create_audit_key: bool,
    audit_checkpoint: str | None,
    audit_checkpoint_interval: float,
    audit_max_bytes: int,
    audit_retention_days: float,
    audit_max_total_bytes: int,
    history_dir: str | None,
    history_raw_days: float,
    history_max_bytes: int | None,
    serve_port: int,
    serve_cert: str | None,
    serve_key: str | None,
    requestheader_client_ca_file: str | None,
    requestheader_allowed_names: str,
    requestheader_from_cluster: bool,
    notify_config: str | None,
    console_url: str | None,
    leader_elect: bool,
    identity: str | None,
    lease_namespace: str,
    lease_prefix: str,
    shards: int,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    verbose: bool,
) -> None:
    """Run the controller: drive enrolled devices to their targets, mirror their contracts, decide Intents."""
    try:
        floors = RiskFloors.parse(risk_floors)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--risk-floor") from None
    if mqtt_cert and not mqtt_key:
        raise click.UsageError("--mqtt-cert needs --mqtt-key")
    if require_signatures and not signing_keys:
        raise click.UsageError("--require-signatures needs --signing-keys NAMESPACE/SECRET with the trusted keys")
    if requestheader_from_cluster and requestheader_client_ca_file:
        raise click.UsageError("--requestheader-from-cluster reads the requestheader CA from the cluster; "
                               "leave out --requestheader-client-ca-file")
    notifications, console = _notifications(notify_config), _console_url(console_url)  # checked before anything runs
    scale = _scale(leader_elect, identity, lease_namespace, lease_prefix, shards, lease_duration, renew_deadline,
                   retry_period)
    mqtt_password = broker_password(mqtt_url, mqtt_password_file)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # kopf reports every handled watch event at INFO; the controller logs what matters itself.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if intent_ttl is not None:
        logging.getLogger(__name__).warning("--intent-ttl is deprecated; use --intent-retention (%g s)", intent_ttl)
        intent_retention = intent_ttl
    _load_kube_config()
    config = ControllerConfig(
        mqtt_url=mqtt_url,
        mqtt_password=mqtt_password,
        topic_prefix=topic_prefix,
        mqtt_ca_file=mqtt_ca,
        mqtt_cert_file=mqtt_cert,
        mqtt_key_file=mqtt_key,
        manage_broker_accounts=not no_broker_accounts,
        max_devices_per_namespace=max_devices_per_namespace,
        risk_floors=floors,
        capability_grace_s=capability_grace,
        watch_namespaces=watch_namespaces,
        bridge_namespaces=_bridge_namespaces(bridge_namespaces),
        command_timeout_s=command_timeout,
        heartbeat_interval_s=heartbeat_interval,
        redrive_max_age_s=redrive_max_age,
        coalescing=Coalescing(interval_s=status_interval, deadbands=_parse_deadbands(deadbands)),
        device_message_rate=device_message_rate,
        device_message_burst=device_message_burst,
        broker_log=broker_log,
        require_signatures=require_signatures,
        signing_keys_secret=signing_keys,
        audit_dir=audit_dir,
        audit_key_file=audit_key,
        audit_key_name=audit_key_name,
        audit_create_key=not no_create_audit_key,
        audit_checkpoint=audit_checkpoint,
        audit_checkpoint_interval_s=audit_checkpoint_interval,
        audit_max_bytes=audit_max_bytes,
        audit_retention=Retention(audit_retention_days * 86400.0, audit_max_total_bytes or None),
        idempotency_window_s=idempotency_window,
        history_dir=history_dir,
        history_name=_history_name(os.environ.get("POD_NAME"), identity),
        history_retention=HistoryRetention(raw_days=history_raw_days, max_bytes=history_max_bytes),
        serve_port=serve_port,
        serve_host=listen_host,
        serve_cert_file=serve_cert,
        serve_key_file=serve_key,
        front_proxy=_front_proxy(requestheader_client_ca_file, requestheader_allowed_names, requestheader_from_cluster),
        notifications=notifications,
        console_url=console,
        scale=scale,
    )
    if bool(serve_cert) != bool(serve_key):
        raise click.UsageError("--serve-cert and --serve-key go together")
    if audit_checkpoint is not None and audit_checkpoint.count("/") != 1:
        raise click.BadParameter(f"{audit_checkpoint!r}: use NAMESPACE/NAME", param_hint="--audit-checkpoint")
    required = dict(Policy().approvals_required)
    for pair in approvals:
        risk, _, count = pair.partition("=")
        if risk not in required or not count.isdigit():
            raise click.BadParameter(f"{pair!r}: use RISK=N with RISK one of {', '.join(required)}",
                                     param_hint="--approvals")
        required[risk] = int(count)
    intent_settings = IntentSettings(
        policy=Policy(approvals_required=required, freshness=timedelta(seconds=freshness),
                      freshness_cap=timedelta(seconds=freshness_cap),
                      approval_window=timedelta(seconds=approval_window),
                      hold_window=timedelta(seconds=contract_hold_window),
                      people=_people(people_namespace, approver_service_accounts),
                      rate_limit=rate_limit),
        execution_timeout_s=intent_timeout,
        retention=timedelta(seconds=intent_retention),
    )
    asyncio.run(_operate(config, intent_settings, health_port, listen_host, list(watch_namespaces)))


def _scale(leader_elect: bool, identity: str | None, namespace: str, prefix: str, shards: int, lease_duration: float,
           renew_deadline: float, retry_period: float) -> ScaleSettings:
    if not leader_elect and shards != 1:
        raise click.UsageError(f"--shards {shards} needs --leader-elect: shards are held through Leases")
    if identity is not None and not identity.strip():
        raise click.BadParameter("an empty identity names nobody", param_hint="--identity")
    # A restarted container is another process: it must not pass for the holder its predecessor was.
    who = identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"
    try:
        return ScaleSettings(identity=who, namespace=namespace, lease_prefix=prefix, shards=shards,
                             lease_duration_s=lease_duration, renew_deadline_s=renew_deadline,
                             retry_period_s=retry_period, enabled=leader_elect)
    except ValueError as err:
        raise click.UsageError(f"--lease-duration, --renew-deadline, --retry-period, --shards: {err}") from None


def _history_name(pod_name: str | None, identity: str | None) -> str:
    """The replica's part of the file name: its StatefulSet ordinal (stable across restarts and rollouts, as its
    volume is), else the `--identity` given, else "controller". Never the default identity, whose random suffix
    would start a new file at each restart."""
    ordinal = ORDINAL.search(pod_name or "")
    if ordinal:
        return ordinal[1]
    if identity and identity.strip():
        return FILE_UNSAFE.sub("_", identity.strip())[:100]
    return "controller"


def _bridge_namespaces(given: tuple[str, ...]) -> tuple[str, ...]:
    """The namespaces named, else the controller's own: who may create Secrets there is the operator's choice."""
    for namespace in given:
        if not DNS_LABEL.fullmatch(namespace):
            raise click.BadParameter(f"{namespace!r} is not a namespace name", param_hint="--bridge-namespace")
    if given:
        return tuple(dict.fromkeys(given))
    own = os.environ.get("POD_NAMESPACE", "").strip()
    if not own and IN_CLUSTER_NAMESPACE.is_file():
        own = IN_CLUSTER_NAMESPACE.read_text().strip()
    if not own:
        click.echo("corral run: no --bridge-namespace and not in a Pod: bridge and source Secrets make no broker "
                   "accounts (each is refused, with a Warning Event on it)", err=True)
    return (own,) if own else ()


def _rate_limit(text: str) -> RateLimit:
    try:
        return RateLimit.parse(text)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--rate-limit") from None


def _people(namespace: str, service_accounts: tuple[str, ...]) -> People:
    try:
        return people_of(namespace, service_accounts)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--approver-service-account") from None


def _notifications(path: str | None) -> NotifySettings | None:
    if path is None:
        return None
    try:
        return load_notify_config(path)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--notify-config") from None


def _console_url(url: str | None) -> str | None:
    if not url:
        return None
    try:
        return check_url(url).rstrip("/")
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--console-url") from None


def _parse_deadbands(pairs: tuple[str, ...]) -> dict[str, float]:
    parsed = {}
    for pair in pairs:
        metric, _, value = pair.partition("=")
        try:
            parsed[metric.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"{pair!r} is not METRIC=NUMBER, e.g. rssi=6", param_hint="--deadband") from None
        if not metric.strip() or parsed[metric.strip()] < 0:
            raise click.BadParameter(f"{pair!r} needs a metric name and a non-negative number", param_hint="--deadband")
    return parsed


def _front_proxy(ca_file: str | None, allowed_names: str, from_cluster: bool) -> FrontProxy | None:
    """Whose client certificate vouches for callers through the aggregation layer: the CA file given, or what
    kube-apiserver publishes in kube-system/extension-apiserver-authentication (read once, at start)."""
    names = [n.strip() for n in allowed_names.split(",") if n.strip()]
    if ca_file:
        try:
            return FrontProxy(ca_file, names)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--requestheader-client-ca-file") from None
    if not from_cluster:
        return None
    namespace, name = AUTH_CONFIGMAP
    try:
        data = kubernetes.client.CoreV1Api().read_namespaced_config_map(name, namespace).data or {}
    except kubernetes.client.ApiException as err:
        raise click.ClickException(
            f"--requestheader-from-cluster: could not read the ConfigMap {namespace}/{name}: {err.status} {err.reason} "
            f"(the controller needs the Role extension-apiserver-authentication-reader in {namespace})") from None
    ca_pem = data.get("requestheader-client-ca-file")
    if not ca_pem:
        logging.getLogger(__name__).warning(
            "%s/%s has no requestheader-client-ca-file: the API server runs no aggregation layer, so requests "
            "naming their caller in X-Remote-* headers are refused; direct callers still use bearer tokens",
            namespace, name)
        return None
    try:
        return FrontProxy(ca_pem.encode(), _json_list(data, "requestheader-allowed-names"),
                          username_headers=_json_list(data, "requestheader-username-headers") or USERNAME_HEADERS,
                          group_headers=_json_list(data, "requestheader-group-headers") or GROUP_HEADERS)
    except ValueError as err:
        raise click.ClickException(f"--requestheader-from-cluster: {namespace}/{name}: {err}") from None


def _json_list(data: dict[str, str], key: str) -> list[str]:
    """A ConfigMap entry kube-apiserver writes as a JSON list of strings (missing: empty)."""
    try:
        value = json.loads(data.get(key) or "[]")
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} is not a JSON list of strings: {data.get(key)!r}")
    return value


def _load_kube_config() -> None:
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config()
        else:
            kubernetes.config.load_kube_config()
    except (kubernetes.config.ConfigException, OSError) as err:
        raise click.ClickException(f"no Kubernetes credentials: {err} (set KUBECONFIG or run in a cluster)") from None


async def _operate(config: ControllerConfig, intent_settings: IntentSettings, health_port: int, host: str,
                   namespaces: list[str]) -> None:
    # A write past a file size limit fails with EFBIG instead of killing the process: the audit log then
    # refuses new decisions and says why, and the controller keeps driving devices.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # kopf stops on SIGINT and SIGTERM itself. No stop_flag: kopf would wait on its waiter task for 5 s
    # at every shutdown, as a task it cannot tell from a hung one.
    await kopf.operator(
        registry=build_registry(config, intent_settings),
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=True,
        # kopf would name itself by the passwd entry of its uid, which the image's USER 10001 lacks (getpass raises
        # KeyError and the controller Pod crash-loops); standalone, the identity only names this process in logs.
        identity=Identity(f"uid{os.getuid()}@{socket.gethostname()}"),
        liveness_endpoint=f"http://{_url_host(host)}:{health_port}/healthz" if health_port else None,
    )


def _url_host(host: str) -> str:
    """An address as a URL's host: IPv6 in brackets."""
    return f"[{host}]" if ":" in host else host
