"""Approval requests reach webhooks: the real controller, a real lock on the real broker, and real HTTP receivers.

The receivers are an aiohttp server in this process (a thread of its own, on a free port): `phone` (ntfy, its
URL and a token from files, as the chart mounts a Secret), `team` (Slack), `broken` (json, always 500) and
`stuck` (json, answers only when the test lets it). The lock's `locked` is high risk, so an Intent for it
waits for a person, and every webhook is told once. The broken one is retried with growing gaps, then given up
on, visible in the controller's metrics and as a Warning Event on the Intent; the stuck one delays nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from aiohttp import web

from corral.cli.main import cli
from corral.client.intents import submit, wait_settled
from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from corral.notify.sender import load_config
from tests.controller_harness import device, events, running_controller
from tests.fleet_harness import running_fleet
from tests.harness import grant, scrape, wait_for
from tests.helm_harness import KUBE_VERSION, Helm, helm_binary

pytestmark = pytest.mark.integration

CONSOLE = "https://console.test/corral"
FLEET = {"front-lock": "lock", "kitchen-light": "light"}
ATTEMPTS = 4


@dataclass(frozen=True)
class Seen:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes


class Receivers:
    """Webhook receivers on one port: /ntfy/..., /slack/... answer 200, /broken/... 500, /stuck/... only once
    released."""

    def __init__(self) -> None:
        self.port = free_port()
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._release = asyncio.Event()
        self._ready = threading.Event()
        self._stop: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),), daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def seen(self, prefix: str) -> list[Seen]:
        with self._lock:
            return [s for s in self._seen if s.path.startswith(prefix)]

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._release.set)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self._seen.append(Seen(time.monotonic(), request.path, dict(request.headers), await request.read()))
        if request.path.startswith("/broken/"):
            return web.Response(status=500, text="receiver is down")
        if request.path.startswith("/stuck/"):
            await self._release.wait()
        return web.Response(status=200, text="ok")

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._stop = self._loop.create_future()
        self._ready.set()
        await self._stop
        await runner.cleanup()

    def __enter__(self) -> Receivers:
        self._thread.start()
        assert self._ready.wait(5), "the receivers did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self.release()
        self._loop.call_soon_threadsafe(lambda: self._stop is not None and self._stop.set_result(None))
        self._thread.join(5)


@dataclass
class Home:
    namespace: str
    operator: kubernetes.client.ApiClient
    admin: kubernetes.client.ApiClient
    receivers: Receivers
    metrics_port: int
    log: Path

    def user(self, name: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{name}"


@pytest.fixture
def home(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[Home]:
    prefix = f"ntf-{uuid.uuid4().hex[:8]}"
    operator = grant(plane, corral_api, namespace, "operator", "[get, list, read, listen, write]", "[get, create]",
                     "get")
    with Receivers() as receivers:
        # The phone's URL and token come from files, as from a mounted Secret.
        (tmp_path / "phone-url").write_text(receivers.url("/ntfy/topic-s3cret") + "\n")
        (tmp_path / "phone-headers").write_text("Authorization: Bearer tk_s3cret\n")
        config = {
            "webhooks": [
                {"name": "phone", "kind": "ntfy", "urlFile": str(tmp_path / "phone-url"),
                 "headersFile": str(tmp_path / "phone-headers")},
                {"name": "team", "kind": "slack", "url": receivers.url("/slack/T0/B0/hook-s3cret")},
                {"name": "broken", "kind": "json", "url": receivers.url("/broken/hook-s3cret")},
                {"name": "stuck", "kind": "json", "url": receivers.url("/stuck/hook")},
            ],
            "retry": {"attempts": ATTEMPTS, "initialDelaySeconds": 0.2, "maxDelaySeconds": 2, "timeoutSeconds": 15},
        }
        (tmp_path / "notify.yaml").write_text(yaml.safe_dump(config))
        metrics_port = free_port()
        with running_fleet(plane, prefix, FLEET, enroll_in=(corral_api, namespace)), \
                running_controller(plane, namespace, prefix, tmp_path, "--approval-window", "60",
                                   "--notify-config", str(tmp_path / "notify.yaml"), "--console-url", CONSOLE,
                                   "--metrics-port", str(metrics_port)):
            wait_for(lambda: all((device(corral_api, namespace, d).get("status") or {}).get("inSync") for d in FLEET),
                     "every device registered and in sync", timeout_s=20)
            yield Home(namespace, operator, corral_api, receivers, metrics_port, tmp_path / "controller.log")


def ask(home: Home, name: str, device_name: str, actuator: str, value: Any) -> dict[str, Any]:
    spec = {"device": device_name, "actuator": actuator, "action": "set_state", "params": {"value": value},
            "reason": "Everyone left <!channel>", "requester": home.user("operator")}
    assert submit(home.operator, home.namespace, name, spec).code == "CREATED"
    return wait_settled(home.operator, home.namespace, name, timeout_s=10)


def series(name: str, **labels: str) -> str:
    """A series as prometheus_client writes it: labels in alphabetical order."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_a_waiting_intent_is_announced_to_every_webhook_and_failures_are_retried_counted_and_told(home: Home) -> None:
    rx = home.receivers
    intent = ask(home, "lock-up-0001", "front-lock", "locked", True)
    assert intent["status"]["phase"] == "AwaitingApproval"
    link = f"{CONSOLE}/intents/{home.namespace}/lock-up-0001"

    # ntfy: the message as text, with Title, Click (the link), Tags and Priority, and the token from its file.
    (phone,) = wait_for(lambda: rx.seen("/ntfy/"), "the phone's notification", timeout_s=10)
    assert phone.path == "/ntfy/topic-s3cret"
    assert phone.headers["Click"] == link and phone.headers["Priority"] == "4"
    assert phone.headers["Title"] == "Approval needed: locked on front-lock (high risk)"
    assert "warning" in phone.headers["Tags"] and phone.headers["Authorization"] == "Bearer tk_s3cret"
    text = phone.body.decode()
    assert f"{home.user('operator')} asks to set_state locked = true on front-lock" in text and link in text

    # Slack: the link in Slack's form, the requester's text unable to mention anyone.
    (team,) = wait_for(lambda: rx.seen("/slack/"), "the team's notification", timeout_s=10)
    slack = json.loads(team.body)["text"]
    assert f"<{link}|Review and decide on lock-up-0001>" in slack and "&lt;!channel&gt;" in slack

    # A webhook that never answers delays no decision: a low-risk Intent runs while it still waits.
    wait_for(lambda: rx.seen("/stuck/"), "the stuck webhook to be called", timeout_s=10)
    light = ask(home, "light-on-0001", "kitchen-light", "power", True)
    assert (light["status"]["phase"], light["status"].get("code")) == ("Succeeded", "EXECUTED")
    assert len(rx.seen("/stuck/")) == 1  # still the first attempt, unanswered

    # The broken one: every attempt, with growing gaps, then given up on and told on the Intent.
    broken = wait_for(lambda: b if len(b := rx.seen("/broken/")) >= ATTEMPTS else None,
                      f"{ATTEMPTS} attempts at the broken webhook", timeout_s=10)
    gaps = [b.at - a.at for a, b in pairwise(broken)]
    assert all(later > earlier for earlier, later in pairwise(gaps)), gaps
    assert 0.2 <= gaps[0] < 0.6, gaps
    failed = wait_for(lambda: [e for e in events(home.admin, home.namespace, "lock-up-0001")
                               if e.reason == "NotificationFailed"], "the NotificationFailed Event", timeout_s=10)
    (event,) = failed
    assert event.type == "Warning" and event.regarding.kind == "Intent" and event.regarding.uid == intent["metadata"]["uid"]
    assert "webhook broken (json)" in event.note and f"gave up after {ATTEMPTS} attempts: HTTP 500" in event.note
    assert "s3cret" not in event.note

    metrics = wait_for(lambda: (m := scrape(home.metrics_port)).get(
        series("corral_notifications_total", webhook="broken", outcome="failed")) == 1 and m, "the failure counted")
    assert metrics[series("corral_notification_attempts_total", webhook="broken", result="retried")] == ATTEMPTS - 1
    assert metrics[series("corral_notification_attempts_total", webhook="broken", result="failed")] == 1
    for hook in ("phone", "team"):
        assert metrics[series("corral_notifications_total", webhook=hook, outcome="sent")] == 1
        assert metrics[series("corral_notification_attempts_total", webhook=hook, result="retried")] == 0
    # Once per Intent: a reconcile of the waiting Intent announces nothing again; no secret reaches the log.
    assert len(rx.seen("/ntfy/")) == 1 and len(rx.seen("/slack/")) == 1 and len(rx.seen("/broken/")) == ATTEMPTS
    assert "s3cret" not in home.log.read_text()


# ---- the chart -----------------------------------------------------------------------------------------------

CHART = Path(__file__).resolve().parents[2] / "charts" / "corral"


@pytest.fixture(scope="module")
def helm(request: pytest.FixtureRequest) -> Helm:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    return Helm(helm_binary(lambda line: reporter.write_line(f"[helm] {line}") if reporter else print(line)))


def test_the_chart_renders_a_notify_config_corral_accepts_with_secrets_mounted(helm: Helm, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "signing": {"require": False},
        "networkPolicy": {"enabled": True, "egress": {"restrict": True}},
        "notifications": {
            "consoleUrl": CONSOLE,
            "webhooks": [
                {"name": "phone", "kind": "ntfy", "secretName": "corral-ntfy", "headersSecretName": "corral-ntfy"},
                {"name": "team", "kind": "slack", "secretName": "corral-slack", "secretKey": "webhook"},
                {"name": "local", "kind": "json", "url": "http://receiver.home.svc:8080/hook",
                 "headers": {"X-Source": "corral"}},
            ],
            "retry": {"attempts": 3},
        },
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    rendered = helm("template", "corral", str(CHART), "-n", "corral-system", "--kube-version", KUBE_VERSION,
                    "-f", str(tmp_path / "values.yaml")).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "corral-notifications")
    controller = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "corral-controller")
    pod = controller["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--notify-config") + 1] == "/etc/corral/notify/notify.yaml"
    assert args[args.index("--console-url") + 1] == CONSOLE
    assert {"name": "notifications", "mountPath": "/etc/corral/notify", "readOnly": True} in container["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "notifications"]
    projected = {(s.get("secret") or s.get("configMap"))["name"]: s for s in volume["projected"]["sources"]}
    assert [item for s in volume["projected"]["sources"] if "secret" in s for item in s["secret"]["items"]] == [
        {"key": "url", "path": "secrets/phone/url"}, {"key": "headers", "path": "secrets/phone/headers"},
        {"key": "webhook", "path": "secrets/team/url"}]
    assert "corral-notifications" in projected
    # The pod's files, here: the config as rendered and the Secrets' contents where the volume puts them.
    root = tmp_path / "pod"
    files = {"notify.yaml": config_map["data"]["notify.yaml"].replace("/etc/corral/notify", str(root)),
             "secrets/phone/url": "https://ntfy.example/topic\n", "secrets/phone/headers": "Authorization: Bearer x\n",
             "secrets/team/url": "https://hooks.slack.example/services/T/B/x\n"}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    settings = load_config(root / "notify.yaml")
    assert [(w.name, w.kind, w.url) for w in settings.webhooks] == [
        ("phone", "ntfy", "https://ntfy.example/topic"), ("team", "slack", "https://hooks.slack.example/services/T/B/x"),
        ("local", "json", "http://receiver.home.svc:8080/hook")]
    assert settings.webhooks[0].headers == {"Authorization": "Bearer x"} and settings.retry.attempts == 3
    # `corral run` takes the rendered arguments (with the pod's paths here).
    monkeypatch.setenv("CORRAL_MQTT_URL", "mqtt://broker:1883")
    local = [str(root / "notify.yaml") if a == "/etc/corral/notify/notify.yaml" else a for a in args[1:]]
    for i, arg in enumerate(local):
        if arg.startswith("/etc/corral/serving/"):
            (tmp_path / Path(arg).name).write_text("")
            local[i] = str(tmp_path / Path(arg).name)
    cli.commands["run"].make_context("run", local)
    # With egress restricted, the controller may reach webhooks on notifications.egressPorts.
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "corral-controller")
    assert {"ports": [{"port": 443, "protocol": "TCP"}]} in policy["spec"]["egress"]
    # Without webhooks, nothing of it.
    plain = helm("template", "corral", str(CHART), "--kube-version", KUBE_VERSION, "--set", "signing.require=false").stdout
    assert "notify" not in plain
