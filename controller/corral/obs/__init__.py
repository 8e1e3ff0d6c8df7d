"""Observability: Prometheus metrics (metrics.py) and OpenTelemetry tracing (tracing.py)."""
