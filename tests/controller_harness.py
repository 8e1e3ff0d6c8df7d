"""Running the real controller (`corral run`) as a separate process against the test plane.

A separate process, so tests can kill it with SIGKILL mid-command and start it
again, exactly as a crash in production would look.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import kubernetes

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.devcluster.files import BROKER_CONTROLLER
from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from corral.privatefile import write_private
from tests.harness import healthz, wait_for

CORRAL = str(Path(sys.executable).parent / "corral")


class ControllerProcess:
    def __init__(self, plane: Plane, namespace: str | None, prefix: str, log_path: Path, *extra: str,
                 mqtt_url: str | None = None, username: str = BROKER_CONTROLLER,
                 checkpoint: str = "corral-controller") -> None:
        """namespace None: a controller that watches every namespace. username: which of the plane's controller
        accounts it connects as (corral-controller, or corral-controller-1..3 for replicas side by side: the broker
        takes the username as client id, so two controllers on one account take each other's session, and each
        takeover fires the other's Will). mqtt_url: an account the plane does not know, password included.
        checkpoint: the AuditCheckpoint it publishes to (one per replica: each has its own chain)."""
        self.plane = plane
        self.mqtt_url = mqtt_url
        self.username = username
        self.checkpoint = checkpoint
        self.namespace = namespace
        self.prefix = prefix
        self.log_path = log_path
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_port = free_port()
        # Its own audit log, kept across restarts of this controller (a kill, then a start again).
        self.audit_dir = log_path.parent / f"{log_path.stem}-audit"
        self.audit_key = log_path.parent / "audit-keys" / "controller.pem"
        self.serve_port = free_port()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def serve_url(self) -> str:
        return f"https://127.0.0.1:{self.serve_port}"

    @property
    def serve_ca(self) -> Path:
        return self.audit_key.parent / "serving-ca.crt"

    def start(self) -> None:
        argv = [
            CORRAL, "run", *self._mqtt_args(),
            *(("--watch-namespace", self.namespace) if self.namespace else ()), "--topic-prefix", self.prefix,
            "--health-port", str(self.health_port), "--command-timeout", "4",
            "--audit-dir", str(self.audit_dir), "--audit-key", str(self.audit_key),
            *(("--audit-checkpoint", f"{self.namespace}/{self.checkpoint}") if self.namespace else ()),
            "--audit-checkpoint-interval", "5", "--serve-port", str(self.serve_port),
            # Tests fire Intents faster than an agent may (the soak: 10 a second); the rate limit's own test sets it.
            "--rate-limit", "0/60", *self.extra,
        ]
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(self._healthy, f"the controller to answer /healthz (log: {self.log_path})", timeout_s=30)

    def _mqtt_args(self) -> list[str]:
        """The broker account as `corral run` takes it: the username in the URL, the password from a file."""
        if self.mqtt_url is None:
            return self.plane.mqtt_args_as(self.username)
        parts = urlsplit(self.mqtt_url)
        if parts.password is None:
            return ["--mqtt", self.mqtt_url]
        secret = self.log_path.parent / f"{self.log_path.stem}-mqtt.password"
        write_private(secret, unquote(parts.password))
        account = urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}"))
        return ["--mqtt", account, "--mqtt-password-file", str(secret)]

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the controller exited with {self.proc.returncode}:\n{self.log_tail()}")
        return healthz(self.health_port)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, like a crashed node."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: a hung controller. Its connections stay open, so the broker sends no Will until the
        keep-alive runs out (1.5 x 30 s); it sends nothing, heartbeats included."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: the hung controller carries on where it stopped."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen one must run to hear SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextmanager
def running_controller(plane: Plane, namespace: str, prefix: str, log_dir: Path, *extra: str) -> Iterator[ControllerProcess]:
    controller = ControllerProcess(plane, namespace, prefix, log_dir / "controller.log", *extra)
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()


def devices(client: kubernetes.client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    items = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(GROUP, VERSION, namespace, "devices")
    return {item["metadata"]["name"]: item for item in items["items"]}


def device(client: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return kubernetes.client.CustomObjectsApi(client).get_namespaced_custom_object(GROUP, VERSION, namespace, "devices", name)


def set_target(client: kubernetes.client.ApiClient, namespace: str, name: str, target: dict[str, Any]) -> None:
    """What `kubectl apply` of a new target does: server-side apply of spec.target as a person."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": name},
            "spec": {"deviceId": name, "target": target}}
    kubernetes.client.CustomObjectsApi(client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "devices", name, body,
        field_manager="kubectl", force=True, _content_type="application/apply-patch+yaml",
    )


def events(client: kubernetes.client.ApiClient, namespace: str, name: str) -> list[Any]:
    listed = kubernetes.client.EventsV1Api(client).list_namespaced_event(
        namespace, field_selector=f"regarding.name={name}"
    )
    return sorted(listed.items, key=lambda e: e.event_time or e.metadata.creation_timestamp)


def status_write_count(plane: Plane) -> int:
    """Status writes to Devices as the API server itself counts them (its request metrics)."""
    request = urllib.request.Request(plane.server + "/metrics", headers={"Authorization": f"Bearer {plane.admin_token}"})
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        body = response.read().decode()
    total = 0
    for line in body.splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'group="corral.dev"' in line
            and 'resource="devices"' in line
            and 'subresource="status"' in line
            and any(f'verb="{verb}"' in line for verb in ("APPLY", "PATCH", "UPDATE"))
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def finals(admin: kubernetes.client.ApiClient, namespace: str, names: list[str]) -> dict[str, str]:
    """Intent name -> its final code, once every one of `names` has ended; else {} (a wait_for probe)."""
    items = kubernetes.client.CustomObjectsApi(admin).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "intents")["items"]
    status = {i["metadata"]["name"]: (i.get("status") or {}) for i in items}
    done = {n: str(status[n].get("code")) for n in names if status.get(n, {}).get("phase") in FINAL_PHASES}
    return done if len(done) == len(names) else {}
