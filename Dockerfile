# syntax=docker/dockerfile:1
#
# outbox-relay images (README, "Containers"). Stages:
#   build        a virtual environment in /opt/venv with the relay and its dependencies
#   spark-build  the same plus PySpark and the Spark connector jars (resolved with Maven here)
#   pipeline     `outbox-relay pipeline ...` (docker-compose profile "spark"): JRE, no Maven
#   relay        the default target (last stage): the relay alone, as a non-root user
#
# Every dependency of the relay installs from a binary wheel, so no stage has a compiler; the
# final stages get only /opt/venv (and the pipeline its jars), not pip's caches or the sources.
# Debian 12 (bookworm) is pinned because its OpenJDK 17 is what PySpark 4.0 is tested with.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY schemas ./schemas
COPY relay ./relay
RUN pip install --no-cache-dir -c constraints.txt .


FROM build AS spark-build
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends maven openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir -c /src/constraints.txt "/src[spark]"
ENV RELAY_CACHE_DIR=/opt/outbox-relay-cache
# From the source tree (sys.path[0] is /src under -m): the Maven pom lives beside the module.
RUN python -m relay.spark.jars


FROM ${PYTHON_IMAGE} AS pipeline
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --create-home --shell /usr/sbin/nologin relay \
    && mkdir /data \
    && chown relay:relay /data
COPY --from=spark-build /opt/venv /opt/venv
COPY --from=spark-build /opt/outbox-relay-cache /opt/outbox-relay-cache
ENV PATH=/opt/venv/bin:$PATH \
    RELAY_CACHE_DIR=/opt/outbox-relay-cache \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /data
ENTRYPOINT ["outbox-relay", "pipeline"]
CMD ["materialize", "--output", "/data/lake"]


FROM ${PYTHON_IMAGE} AS relay
RUN groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin relay
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RELAY_HTTP_PORT=8080 \
    RELAY_LOG_FORMAT=json
USER 10001:10001
EXPOSE 8080
# /livez fails only when the relay's loop is stuck (not when a server is down: that is /readyz).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('RELAY_HTTP_PORT', '8080'), timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["outbox-relay", "run"]
