"""Settings of `corral run`, one place with their defaults and why."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.audit.requests import IDEMPOTENCY_WINDOW
from corral.audit.signer import Retention
from corral.contract.trust import RiskFloors
from corral.devices.limits import DEFAULT_BURST, DEFAULT_RATE
from corral.devices.telemetry import Coalescing
from corral.history.model import Retention as HistoryRetention
from corral.notify.payloads import NotifySettings
from corral.scale.settings import ScaleSettings
from corral.serving.frontproxy import FrontProxy


@dataclass(frozen=True)
class ControllerConfig:
    mqtt_url: str  # never with a password in it: process arguments and environments are readable by others
    topic_prefix: str = "iot"
    # The account's password, read from `--mqtt-password-file` (a Secret volume in the chart); kept out of reprs.
    mqtt_password: str | None = field(default=None, repr=False)
    # mqtts://: the CA that signed the broker's certificate, and the controller's client certificate if any.
    mqtt_ca_file: str | None = None
    mqtt_cert_file: str | None = None
    mqtt_key_file: str | None = None
    # Keep the broker's device accounts equal to the enrollment Secrets (Mosquitto's dynamic security
    # plugin); off for a broker Corral does not manage, whose accounts a person keeps (docs/device-trust.md).
    manage_broker_accounts: bool = True
    # Enrolled devices a namespace may have: beyond it, enrollments get no broker account.
    max_devices_per_namespace: int = 1000
    # Namespaces whose Devices the controller binds; empty means all.
    watch_namespaces: tuple[str, ...] = ()
    # The only namespaces whose bridge and source Secrets make broker accounts (devices.bridge_accounts): a Secret
    # anyone may create in some other watched namespace is refused, with a Warning Event on it. `corral run` defaults
    # it to the namespace it runs in; empty: none.
    bridge_namespaces: tuple[str, ...] = ()
    command_timeout_s: float = 5.0
    # The heartbeat on `{prefix}/_corral/heartbeat` that device failsafes count from (devices.heartbeat); keep it
    # well below the shortest failsafe delay of any contract.
    heartbeat_interval_s: float = 2.0
    # After a failsafe, a target set longer ago than this is not driven again by itself: a person re-applies it.
    redrive_max_age_s: float = 3600.0
    # Backoff between attempts on a device that times out or fails: min * 2**failures, capped.
    backoff_min_s: float = 1.0
    backoff_max_s: float = 60.0
    coalescing: Coalescing = field(default_factory=Coalescing)
    # Each device's event and telemetry messages: a token bucket (devices.limits); beyond it they are dropped
    # and counted (device.flooding records and Flooding Events, a few per burst).
    device_message_rate: float = DEFAULT_RATE
    device_message_burst: int = DEFAULT_BURST
    # The broker's log (Mosquitto with `log_type debug`), tailed for its refused PUBLISHes (devices.refusals):
    # recorded and told per device and burst. None: not read (a broker elsewhere; docs/device-trust.md).
    broker_log: str | None = None
    # lastSeen rides along with other status writes and is refreshed alone at most this often.
    last_seen_interval_s: float = 300.0
    # The cluster's risk floors (contract.trust): a contract can raise an action's risk, never lower it.
    risk_floors: RiskFloors = field(default_factory=RiskFloors)
    # Capabilities no Device uses are deleted after this long (only by a controller that watches every namespace).
    capability_grace_s: float = 3600.0
    require_signatures: bool = False
    signing_keys_secret: str | None = None  # "namespace/name"; each data entry is one trusted public key
    workers: int = 16
    # The audit log (audit.log): its directory (a PVC in the chart), the Ed25519 key that signs it (made there
    # on first start when `audit_create_key`, as on the local plane), and the AuditCheckpoint object
    # ("namespace/name") its checkpoints are published to every `audit_checkpoint_interval_s`.
    audit_dir: str = ".corral/audit"
    audit_key_file: str = ".corral/audit-keys/controller.pem"
    audit_key_name: str = "controller"
    audit_create_key: bool = True
    audit_checkpoint: str | None = None
    audit_checkpoint_interval_s: float = 300.0
    audit_max_bytes: int = 64 * 2**20
    # A file older than this is closed too; closed files are deleted after `audit_retention.max_age_s` (or
    # beyond its total size), on record (audit.retention).
    audit_max_file_age_s: float = 86400.0
    audit_retention: Retention = field(default_factory=Retention)
    # Records of the last this many seconds are read back at start, so no Intent is decided twice (longer
    # than any Intent is kept: an hour's retention, or a day's before it was shortened).
    audit_lookback_s: float = 25 * 3600.0
    # A replayed Intent name is answered from the audit log (DEDUP or DENY_ID_CONFLICT) for this long after the
    # earlier Intent was decided, whether or not it still exists (audit.requests). Closed audit files holding
    # records this young are kept by age retention, whatever `audit_retention.max_age_s` says; only the total
    # size budget can delete them.
    idempotency_window_s: float = IDEMPOTENCY_WINDOW.total_seconds()
    # The HTTPS server that serves the audit log to callers with Kubernetes credentials (0: off). Without a
    # certificate, one is made beside the audit key (serving-ca.crt is the one to trust).
    serve_port: int = 8443
    # Where it (and /healthz, /metrics) listens: loopback unless told otherwise (`--listen-host 0.0.0.0` in a Pod).
    serve_host: str = "127.0.0.1"
    serve_cert_file: str | None = None
    serve_key_file: str | None = None
    # The aggregation layer's front proxy (its requestheader CA and allowed names), whose client certificate
    # vouches for the caller of the readings APIService; None: X-Remote-* headers are refused.
    front_proxy: FrontProxy | None = None
    # Approval requests to webhooks when an Intent starts waiting for a person (notify/sender.py): the loaded
    # --notify-config (None: none are sent), and the approval console's base URL, for the link to each Intent.
    notifications: NotifySettings | None = None
    console_url: str | None = None
    # Leader election and sharding (`--leader-elect`, docs/scale.md): not enabled, the controller stands alone and
    # owns every device; enabled, it acts only for the devices of the shards whose Leases it holds.
    scale: ScaleSettings = field(default_factory=lambda: ScaleSettings(identity="standalone"))
    # The history of samples (corral.history): off without a directory. Each replica writes its own file there,
    # history-<history_name>.sqlite3 (the StatefulSet ordinal, else --identity), for the devices of its shards.
    history_dir: str | None = None
    history_name: str = "controller"
    history_retention: HistoryRetention = field(default_factory=HistoryRetention)
    # Staged samples are written in one batch this often: what a crash may lose, and how late a query sees a
    # sample (the ring buffers hold the last minutes anyway). Longer batches write fewer bytes a sample
    # (history/aio.py): at fleet size on flash, a minute.
    history_flush_s: float = 5.0
    history_prune_s: float = 3600.0
