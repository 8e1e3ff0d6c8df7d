"""The history of samples (`corral run --history-dir`) served by the real controller's readings server.

A real sensor (the firmware simulator) on the real broker, a real controller process keeping its history in
SQLite, and callers with ServiceAccount tokens the real API server reviews. The controller is stopped and started
again: the samples it took in before are still answered (raw and in 5-minute rollups), so they came from the
file, not from the ring buffers, which a restart empties. A caller without `listen` gets the same refusal for
the Device as for one that does not exist, and no sample; a bad period gets a 400 naming the periods allowed.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from corral.devcluster.plane import Plane
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import running_fleet
from tests.harness import apply_yaml, fresh_namespace, service_account_token, wait_for, wait_until_allowed

pytestmark = pytest.mark.integration

SENSOR = "store-freezer"
API = "/apis/readings.corral.dev/v1alpha1"
ROLES = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: history-listener}
rules:
- {apiGroups: [corral.dev], resources: [devices], verbs: [get, listen]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: history-deaf}
rules:
- {apiGroups: [corral.dev], resources: [devices], verbs: [get, list, watch]}
"""
BINDING = """
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {role}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {role}}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {namespace}}}]
"""
ACCOUNTS = {"listener": "history-listener", "deaf": "history-deaf"}


@dataclass
class Served:
    namespace: str
    controller: ControllerProcess
    tokens: dict[str, str]

    def get(self, who: str, name: str, query: str) -> tuple[int, Any]:
        """GET .../devices/NAME/history?QUERY on the controller's HTTPS port, with that ServiceAccount's token."""
        path = f"{API}/namespaces/{self.namespace}/devices/{name}/history?{query}"
        request = urllib.request.Request(self.controller.serve_url + path,
                                         headers={"Authorization": f"Bearer {self.tokens[who]}"})
        context = ssl.create_default_context(cafile=str(self.controller.serve_ca))
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def series(self, query: str) -> dict[str, Any]:
        status, answer = self.get("listener", SENSOR, query)
        assert status == 200, answer
        found: dict[str, Any] = answer["series"][0]
        return found


@pytest.fixture(scope="module")
def served(plane: Plane, corral_api: kubernetes.client.ApiClient, kube: kubernetes.client.ApiClient,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("history-api")
    with fresh_namespace(kube, "history-api") as namespace:
        apply_yaml(corral_api, ROLES, namespace)
        tokens = {}
        for account, role in ACCOUNTS.items():
            apply_yaml(corral_api, BINDING.format(role=role, account=account, namespace=namespace), namespace)
            tokens[account] = service_account_token(corral_api, namespace, account)
        wait_until_allowed(_as(plane, tokens["listener"]), "listen", namespace, "devices")
        prefix = f"hst-{namespace[-6:]}"
        with running_fleet(plane, prefix, {SENSOR: "sht30"}, enroll_in=(corral_api, namespace),
                           telemetry_interval_s=0.5):
            controller = ControllerProcess(plane, namespace, prefix, tmp / "controller.log",
                                           "--history-dir", str(tmp / "history"), "--history-raw-days", "2")
            controller.start()
            try:
                wait_for(lambda: (device(corral_api, namespace, SENSOR).get("status") or {}).get("online"),
                         "the sensor online", timeout_s=30)
                yield Served(namespace, controller, tokens)
            finally:
                controller.stop()


def _as(plane: Plane, token: str) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host, configuration.ssl_ca_cert = plane.server, str(plane.ca_file)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(configuration)


def test_history_survives_a_restart_of_the_controller_raw_and_in_5_minute_rollups(served: Served) -> None:
    def kept() -> list[dict[str, Any]]:
        points: list[dict[str, Any]] = served.series("metric=temperature&start=10m&period=raw&limit=1000")["points"]
        return points if len(points) >= 6 else []

    before = wait_for(kept, "temperature samples in the history (a batch is written every 5 s)", timeout_s=30,
                      interval_s=0.5)
    assert {"ts", "received_ms", "value"} <= set(before[0]), before[0]

    served.controller.stop()
    served.controller.start()

    series = served.series("metric=temperature&start=10m&period=raw&limit=1000")
    assert series["unit"] == "°C" and series["found"], series
    after = {(p["ts"], p["value"]) for p in series["points"]}
    assert {(p["ts"], p["value"]) for p in before} <= after, "samples taken in before the restart are gone"
    rollups = served.series("metric=temperature&start=1h&period=5m&stats=count,mean,min,max")["points"]
    assert sum(p["count"] for p in rollups) >= len(before), rollups
    values = [p["value"] for p in before]
    assert min(p["min"] for p in rollups) <= min(values) and max(p["max"] for p in rollups) >= max(values)


def test_a_caller_without_listen_learns_nothing(served: Served) -> None:
    # The positive control, with the default metrics: the contract's sensors, once the device announced it.
    def answered() -> Any:
        status, answer = served.get("listener", SENSOR, "start=10m&period=raw")
        return answer if status == 200 else None

    answer = wait_for(answered, "the history with the contract's sensors", timeout_s=15)
    assert answer["kind"] == "DeviceHistory" and answer["series"][0]["metric"] == "temperature", answer
    assert answer["series"][0]["points"], answer
    refused, said = served.get("deaf", SENSOR, "start=10m&period=raw")
    missing, said_missing = served.get("deaf", "no-such-device", "start=10m&period=raw")
    assert refused == missing == 403, (said, said_missing)
    assert said["message"].replace(SENSOR, "X") == said_missing["message"].replace("no-such-device", "X"), \
        (said, said_missing)
    assert "series" not in said and "listen" in said["message"], said


def test_a_bad_period_is_refused_naming_the_periods_allowed(served: Served) -> None:
    status, answer = served.get("listener", SENSOR, "metric=temperature&period=minute")
    assert status == 400, answer
    assert "period='minute': use one of raw, 5m, hour, day" in answer["message"], answer
    status, answer = served.get("listener", SENSOR, "metric=temperature&period=hour&limit=5")
    assert status == 200 and answer["limit"] == 5, answer
