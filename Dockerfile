# syntax=docker/dockerfile:1
#
# outbox-relay images (README, "Containers"). Stages:
#   native       the relay's wheel, with its compiled hot path (native/, Rust): the only stage
#                with a compiler (the Rust image's cargo and gcc); Debian 12's Python 3.11
#                builds a cp311 wheel the python:3.11 stages install
#   deps         a virtual environment in /opt/venv with the relay's dependencies (cached while
#                only the relay's sources change)
#   build        deps plus the relay
#   spark-build  deps plus PySpark, the relay and the Spark connector jars (resolved with Maven)
#   pipeline     `outbox-relay pipeline ...` (docker-compose profile "spark"): JRE, no Maven
#   relay        the default target (last stage): the relay alone, as a non-root user
#
# Every other dependency of the relay installs from a binary wheel, so only the native stage has
# a compiler; the final stages get only /opt/venv (and the pipeline its jars), not pip's caches,
# the sources or a toolchain. Debian 12 (bookworm) is pinned because its OpenJDK 17 is what
# PySpark 4.0 is tested with, and its Python is 3.11 like the python:3.11 image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RUST_IMAGE=rust:1.95-slim-bookworm

FROM ${RUST_IMAGE} AS native
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/wheel-build \
    && /opt/wheel-build/bin/pip install --no-cache-dir --upgrade pip
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY schemas ./schemas
COPY relay ./relay
COPY native ./native
# cargo's build folder is a cache mount: when only relay/ changes, the crate is not compiled again.
RUN --mount=type=cache,target=/src/native/target \
    /opt/wheel-build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .


FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The relay's dependencies from pyproject.toml and constraints.txt alone: this layer (and the
# Spark one on top) stays cached when only the relay's sources change.
COPY pyproject.toml README.md constraints.txt ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
       > /tmp/requirements.txt \
    && pip install --no-cache-dir -c constraints.txt -r /tmp/requirements.txt


FROM deps AS build
COPY --from=native /wheels /wheels
COPY schemas ./schemas
COPY relay ./relay
RUN pip install --no-cache-dir -c constraints.txt /wheels/outbox_relay-*.whl


FROM deps AS spark-build
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends maven openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir -c /src/constraints.txt pyspark
COPY --from=native /wheels /wheels
COPY schemas ./schemas
COPY relay ./relay
RUN pip install --no-cache-dir -c constraints.txt /wheels/outbox_relay-*.whl
ENV RELAY_CACHE_DIR=/opt/outbox-relay-cache
# From the source tree (sys.path[0] is /src under -m): the Maven pom lives beside the module.
RUN python -m relay.dev.spark_jars


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
