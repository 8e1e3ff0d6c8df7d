# Controller/gateway image. A first cut: the packaging issue turns this into a
# multi-stage build with OCI labels and a lint check. There is no Docker engine
# on the development machines, so it is not built here.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY controller ./controller
RUN pip install --no-cache-dir . && useradd --uid 10001 --no-create-home corral
USER 10001
ENTRYPOINT ["corral"]
