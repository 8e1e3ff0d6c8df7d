# syntax=docker/dockerfile:1
# One image for the controller (`corral run`) and the MCP gateway (`corral mcp`): the chart picks by argument.
#
# Stage 1 installs Corral into a virtualenv; stage 2 copies only that virtualenv onto a fresh slim
# Python, so pip's caches and anything a build needed stay behind. Every dependency ships wheels, so
# no compiler is needed in either stage. tests/unit/test_dockerfile.py checks this file with BuildKit's
# own parser (there is no Docker engine on the development machines to build it).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/corral
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY firmware/corral_fw ./firmware/corral_fw
COPY firmware/corral_sim ./firmware/corral_sim
RUN /opt/corral/bin/pip install --no-cache-dir . \
 && /opt/corral/bin/corral --version

FROM ${PYTHON_IMAGE}
ARG CORRAL_VERSION=0.1.0
LABEL org.opencontainers.image.title="corral" \
      org.opencontainers.image.description="Corral controller and MCP gateway: let AI agents operate physical devices safely." \
      org.opencontainers.image.version="${CORRAL_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/corral-dev/corral" \
      org.opencontainers.image.documentation="https://github.com/corral-dev/corral/blob/main/README.md"
COPY --from=build /opt/corral /opt/corral
ENV PATH=/opt/corral/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so Kubernetes can verify runAsNonRoot; the chart runs the root filesystem read-only.
USER 10001:10001
WORKDIR /tmp
# 8080: controller /healthz; 8000: gateway (MCP over HTTP, /healthz)
EXPOSE 8000 8080
ENTRYPOINT ["corral"]
CMD ["--help"]
