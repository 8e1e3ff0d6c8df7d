"""OpenTelemetry tracing: one trace from an MCP tool call to the device's ack, across three hops.

- gateway -> controller: the Intent carries the W3C `traceparent` in the annotation `corral.dev/traceparent`;
- Intent -> device command: in-process, the Intent's context rides with its expectation on the device;
- controller -> device: MQTT 5 user properties `traceparent` (MQTT 3.1.1: a `trace` object in the payload,
  which the firmware ignores).

Off by default (the API's no-op tracer). `setup("otlp")` exports over OTLP/HTTP; the endpoint and the
rest come from the standard OTEL_EXPORTER_OTLP_* environment variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context

from corral.api.codes import TRACEPARENT_ANNOTATION

TRACERS = ("off", "otlp")


def setup(service: str, exporter: str) -> None:
    if exporter == "off":
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def tracer() -> trace.Tracer:
    return trace.get_tracer("corral")


def carrier() -> dict[str, str]:
    """The current context as W3C headers ({} when nothing is traced)."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


def context_from(headers: Mapping[str, Any] | None) -> Context | None:
    if not headers or "traceparent" not in headers:
        return None
    return propagate.extract({k: str(v) for k, v in headers.items()})


def intent_annotations() -> dict[str, str]:
    """Annotations that carry the current context on an object (for the Kubernetes hop)."""
    traceparent = carrier().get("traceparent")
    return {TRACEPARENT_ANNOTATION: traceparent} if traceparent else {}


def context_of(body: Mapping[str, Any]) -> Context | None:
    traceparent = ((body.get("metadata") or {}).get("annotations") or {}).get(TRACEPARENT_ANNOTATION)
    return context_from({"traceparent": traceparent}) if traceparent else None


def trace_id_of(body: Mapping[str, Any]) -> str | None:
    """The trace id an object carries (its traceparent annotation), for audit records."""
    traceparent = ((body.get("metadata") or {}).get("annotations") or {}).get(TRACEPARENT_ANNOTATION) or ""
    parts = str(traceparent).split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


class FirstTraces:
    """The trace context each object was created in, as first seen, by uid: the annotation feeds signed audit
    records, so it is read once and a later change is ignored (admission refuses one anyway)."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}

    def of(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """A stand-in for the object with only the first traceparent seen, for context_of and trace_id_of."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        seen = self._first.setdefault(uid, str((meta.get("annotations") or {}).get(TRACEPARENT_ANNOTATION) or ""))
        return {"metadata": {"annotations": {TRACEPARENT_ANNOTATION: seen} if seen else {}}}

    def forget(self, uid: str) -> None:
        self._first.pop(uid, None)
