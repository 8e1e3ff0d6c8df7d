"""Readings: the timestamped samples the controller received, read-only, as an aggregated API would serve them.

    GET /apis/readings.corral.dev, /apis/readings.corral.dev/v1alpha1, /openapi/v2
        Discovery (APIGroup, APIResourceList) and an empty OpenAPI document, open to anyone: the aggregator
        asks for them to call the API available and to merge the cluster's OpenAPI.
    GET /apis/readings.corral.dev/v1alpha1/namespaces/NS/devices/NAME[?metrics=a,b][&window_s=60]
        The samples of one Device received in the last `window_s` seconds (default 60, at most the buffer's
        reach), per metric, oldest first; `window_s=0` gives only the newest sample of each metric. Needs the
        `listen` verb on corral.dev devices/NAME in NS, as the device's live updates do.
    GET .../namespaces/NS/devices/NAME/history?metric=&start=&end=&period=&stats=&limit=&offset=
        Samples over days and months, from the history store (serving.history); `listen` as well.

The same paths answer direct callers (bearer token, TokenReview) and callers through the kube aggregator
(`kubectl get --raw /apis/readings.corral.dev/...`, front-proxy client certificate). Each sample carries the
device's `ts` (what an Intent cites in basedOn) and `receivedAt`, the controller's clock when it arrived
(what freshness is measured with).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from corral.api.codes import READINGS_GROUP, READINGS_MAX_WINDOW_S, READINGS_PREFIX, READINGS_VERSION
from corral.contract.model import Contract
from corral.devices.telemetry import MetricRing, Reading

GROUP, VERSION, PREFIX = READINGS_GROUP, READINGS_VERSION, READINGS_PREFIX
LISTEN_VERB = "listen"
DEFAULT_WINDOW_S = 60.0
MAX_WINDOW_S = float(READINGS_MAX_WINDOW_S)


class DeviceSeen(Protocol):
    """What the readings document says of a Device besides its samples (the controller's DeviceView is one)."""

    @property
    def device_id(self) -> str | None: ...

    @property
    def exists(self) -> bool: ...

    @property
    def online(self) -> bool | None: ...

    @property
    def contract(self) -> Contract | None: ...


class ReadingsSource(Protocol):
    """Where the samples come from: the controller hands its device port in (serving never imports reconcile/)."""

    def view(self, namespace: str, name: str) -> DeviceSeen | None: ...

    def rings(self, device_id: str) -> Mapping[str, MetricRing]: ...


def group() -> dict[str, Any]:
    version = {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version],
            "preferredVersion": version}


def discovery() -> dict[str, Any]:
    return {
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}",
        # A subresource of its own, so RBAC can grant reading the recent samples without the history, or both.
        "resources": [{"name": "devices", "singularName": "device", "namespaced": True, "kind": "DeviceReadings",
                       "verbs": ["get"]},
                      {"name": "devices/history", "singularName": "", "namespaced": True, "kind": "DeviceHistory",
                       "verbs": ["get"]}],
    }


def openapi_v2() -> dict[str, Any]:
    """A minimal OpenAPI v2 document: the aggregator merges every APIService's into the cluster's, and asks until
    it gets one (kubectl explain has nothing to say about readings; they are not a stored kind)."""
    return {"swagger": "2.0", "info": {"title": "Corral readings", "version": VERSION}, "paths": {},
            "definitions": {}}


class BadQuery(ValueError):
    pass


def parse_query(query: Mapping[str, str]) -> tuple[frozenset[str] | None, float]:
    """(metrics asked for, or None for all; window in seconds), or BadQuery saying what is allowed."""
    metrics = frozenset(m for m in (query.get("metrics") or "").split(",") if m) or None
    text = query.get("window_s")
    if text is None:
        return metrics, DEFAULT_WINDOW_S
    try:
        window = float(text)
    except ValueError:
        raise BadQuery(f"window_s={text!r}: give seconds from 0 to {MAX_WINDOW_S:g}, e.g. window_s=60") from None
    if not 0 <= window <= MAX_WINDOW_S:
        raise BadQuery(f"window_s={text!r}: give seconds from 0 to {MAX_WINDOW_S:g}")
    return metrics, window


def readings(source: ReadingsSource, namespace: str, name: str, metrics: frozenset[str] | None, window_s: float,
             now_ms: float | None = None) -> dict[str, Any] | None:
    """The DeviceReadings document, or None when there is no such Device."""
    view = source.view(namespace, name)
    if view is None:
        return None
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    units = {s.metric: s.unit for s in view.contract.sensors} if view.contract is not None else {}
    rings = source.rings(view.device_id) if view.device_id and view.exists else {}
    shown: dict[str, Any] = {}
    for metric, ring in sorted(rings.items()):
        if metrics is not None and metric not in metrics:
            continue
        if window_s > 0:
            samples = ring.since(now_ms - window_s * 1000)
        else:
            newest = ring.newest()
            samples = [newest] if newest is not None else []
        shown[metric] = {"unit": units.get(metric, ""), "samples": [_sample(r, now_ms) for r in samples]}
    return {
        "kind": "DeviceReadings", "apiVersion": f"{GROUP}/{VERSION}",
        "metadata": {"name": name, "namespace": namespace},
        "deviceId": view.device_id, "online": view.online, "now": int(now_ms), "windowSeconds": window_s,
        "metrics": shown,
    }


def _sample(reading: Reading, now_ms: float) -> dict[str, Any]:
    return {"ts": reading.ts, "value": reading.value, "receivedAt": int(reading.received_ms),
            "ageSeconds": round(max(0.0, now_ms - reading.received_ms) / 1000, 3)}
