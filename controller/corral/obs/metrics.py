"""Prometheus metrics of the controller and the gateway, named after Prometheus conventions (`corral_` prefix,
base units, `_total` counters). They live in the default registry; `serve()` exposes it on /metrics.

Label values are bounded: decision codes, tool names of the fixed tools, write reasons. Per-device tools
are counted as one label value (`device_tool`), so a fleet of thousands cannot explode the series count.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

DEVICES = Gauge("corral_devices", "Devices known to the controller, by MQTT online state.", ["online"])
COMMANDS_SENT = Counter("corral_commands_sent_total", "Commands published to devices (a resend counts again).")
COMMAND_RESULTS = Counter("corral_command_results_total", "What became of sent commands.", ["result"])
ACK_SECONDS = Histogram("corral_command_ack_seconds", "Time from publishing a command to its ack.",
                        buckets=_LATENCY_BUCKETS)
INTENTS = Counter("corral_intents_total", "Intents that reached a final decision code.", ["code"])
INTENT_SECONDS = Histogram("corral_intent_decision_seconds", "Time from an Intent's creation to its final code.",
                           buckets=(*_LATENCY_BUCKETS, 30.0, 60.0, 300.0))
APPROVALS_WAITING = Gauge("corral_approvals_waiting", "Intents waiting for a human approval.")
# Approval requests to webhooks (notify/sender.py), by the webhook's configured name (a bounded set).
NOTIFICATIONS = Counter("corral_notifications_total",
                        "Approval requests to webhooks, by what became of each: sent, failed (retries exhausted or "
                        "not retryable) or dropped (the webhook's queue was full).", ["webhook", "outcome"])
NOTIFICATION_ATTEMPTS = Counter("corral_notification_attempts_total",
                                "HTTP attempts to deliver approval requests: ok, retried (failed, tried again) or "
                                "failed (failed, the last one).", ["webhook", "result"])
NOTIFICATIONS_QUEUED = Gauge("corral_notifications_queued", "Approval requests waiting to be sent, by webhook.",
                             ["webhook"])
STATUS_WRITES = Counter("corral_status_writes_total", "Status writes to the API server, by reason.", ["reason"])
# What devices said beyond their limits (devices.limits), by kind of message: dropped, counted, never recorded
# one by one.
DEVICE_MESSAGES_DROPPED = Counter("corral_device_messages_dropped_total",
                                  "Device messages over the device's rate limit, dropped and counted.", ["kind"])
# Publishes the broker refused (its ACLs), by the client that tried: an enrolled device id, or "other" for
# any other client (a bounded set: enrolled devices).
BROKER_REFUSALS = Counter("corral_broker_refusals_total",
                          "PUBLISH packets the broker refused by its ACLs, by the client that sent them.", ["client"])
EVENTS_SKIPPED = Counter("corral_events_skipped_total",
                         "Events not posted: their object had too many lately (the kubelet's spam filter).")
# The history store (reconcile/history.py): a failed write loses its batch of samples (write), a failed
# declaration leaves a series without its unit until the next sample (declare), a failed retention pass (prune).
HISTORY_FAILURES = Counter("corral_history_failures_total", "History store operations that failed, by what.",
                           ["what"])
MQTT_RECONNECTS = Counter("corral_mqtt_reconnects_total", "Times the controller's MQTT link came back after a loss.")
TOOL_CALLS = Counter("corral_mcp_tool_calls_total", "MCP tool calls, by tool and outcome.", ["tool", "outcome"])
SHARDS_HELD = Gauge("corral_shards_held", "Shards this controller replica holds (within its renew deadline).")
SHARD_CHANGES = Counter("corral_shard_changes_total", "Shards this replica acquired, released or lost.", ["change"])
MCP_SESSIONS = Gauge("corral_mcp_sessions", "Handshake-era MCP HTTP sessions open at the gateway.")
MCP_CALLER_LIMITED = Counter("corral_mcp_caller_limited_total",
                             "Requests refused (429) because their caller was at a per-caller limit.", ["limit"])
TOOLS_LIST_SECONDS = Histogram("corral_mcp_tools_list_seconds", "Time the gateway takes to answer tools/list.",
                               buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5))


def online_label(online: bool | None) -> str:
    return "unknown" if online is None else str(online).lower()


def device_online_changed(before: bool | None, after: bool | None, new: bool = False) -> None:
    """Move one device between the online-state series (new: it was not counted yet)."""
    if not new:
        DEVICES.labels(online=online_label(before)).dec()
    DEVICES.labels(online=online_label(after)).inc()


def serve(port: int, host: str = "127.0.0.1") -> None:
    """/metrics on `host`, from a thread of prometheus_client's own (never the event loop)."""
    if port:
        start_http_server(port, addr=host)
