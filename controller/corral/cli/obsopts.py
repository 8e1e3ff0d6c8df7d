"""`--metrics-port` and `--traces`, shared by the two long-running commands (`corral run`, `corral mcp`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from corral.obs import metrics, tracing

LOOPBACK = "127.0.0.1"


def observability_options(service: str, host_option: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the two options and start what they ask for before the command runs, as `service`. /metrics listens
    on the address the command's own option `host_option` names (loopback unless told otherwise)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @click.option("--metrics-port", type=int, default=0, show_default=True,
                      help="Port of Prometheus /metrics, on the command's listen address; 0 turns it off.")
        @click.option("--traces", type=click.Choice(tracing.TRACERS), default="off", show_default=True,
                      help="otlp: export OpenTelemetry traces over OTLP/HTTP (endpoint from OTEL_EXPORTER_OTLP_ENDPOINT).")
        @functools.wraps(command)
        def wrapper(metrics_port: int, traces: str, **kwargs: Any) -> Any:
            metrics.serve(metrics_port, kwargs.get(host_option) or LOOPBACK)
            tracing.setup(service, traces)
            return command(**kwargs)

        return wrapper

    return decorate
