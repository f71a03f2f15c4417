# syntax=docker/dockerfile:1
#
# outbox-relay images (README, "Containers"). Stages:
#   requirements the dependency lists alone, read from pyproject.toml (plus constraints.txt): the
#                stages below that install dependencies copy only these files, so an edit to the
#                relay's sources, its README or its tool settings rebuilds none of them
#   native       the relay's wheel, with its compiled hot path (native/, Rust), built by
#                tools/build_wheel.py as `make dist` builds it (one build path): the cp311-abi3
#                manylinux2014 wheel services install. The only stage with a compiler (the Rust
#                image's cargo, and zig from the build tools' ziglang wheel)
#   deps         a virtual environment in /opt/venv with the relay's dependencies, and a .pth
#                file that puts /opt/relay (the relay itself, installed last) on its path
#   build        the relay from its wheel in /opt/relay: the only layer a source change rebuilds
#                (with the wheel and the final images' thin /opt/relay layer)
#   spark-deps   deps plus a JRE, Maven and PySpark
#   spark-build  spark-deps plus the relay and the Spark connector jars (resolved with Maven)
#   pipeline     `outbox-relay pipeline ...` (docker-compose profile "spark"): JRE, no Maven
#   relay        the default target (last stage): the relay alone, as a non-root user
#
# Every other dependency of the relay installs from a binary wheel, so only the native stage has
# a compiler. pip's, cargo's and Maven's downloads live in cache mounts (BuildKit, buildah), never
# in a layer; the final stages get only /opt/venv, /opt/relay (and the pipeline its jars), not the
# caches, the sources or a toolchain. Debian 12 (bookworm) is pinned because its OpenJDK 17 is
# what PySpark 4.0 is tested with, and its Python is 3.11 like the python:3.11 image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RUST_IMAGE=rust:1.95-slim-bookworm

FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /deps
COPY pyproject.toml constraints.txt ./
# requirements.txt: [project] dependencies and the brokers' clients (the `nats` and `rabbitmq`
# extras: the image publishes to whichever RELAY_BROKER says); spark.txt: the `spark` extra. Their
# times are fixed, so they are the same files whenever the lists are.
RUN python -c "import pathlib, tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
x = p['project']['optional-dependencies']; \
w = lambda name, reqs: pathlib.Path(name).write_text(''.join(r + '\n' for r in reqs)); \
w('requirements.txt', p['project']['dependencies'] + x['nats'] + x['rabbitmq']); \
w('spark.txt', x['spark'])" \
    && rm pyproject.toml \
    && touch -d @0 ./*.txt


FROM ${RUST_IMAGE} AS native
# The rust image's own CARGO_HOME, set for bases that lack it: the registry cache mount below.
ENV CARGO_HOME=/usr/local/cargo
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml MANIFEST.in build-constraints.txt ./
COPY tools/build_wheel.py ./tools/
COPY native ./native
COPY schemas ./schemas
COPY relay ./relay
# The wheel as `make dist` builds it. Cache mounts: cargo's registry, pip's downloads, and the
# cache folder holding the build tools' virtual environment (made on the first build) and cargo's
# build folder (the compiled dependencies are reused; cargo downloads nothing). The package's readme is a stand-in: README.md is not in the build
# context, so editing it rebuilds nothing.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,id=outbox-relay-build-tools,target=/root/.cache/outbox-relay \
    echo "outbox-relay: see README.md in the project's repository." > README.md \
    && python3 tools/build_wheel.py --out /wheels --no-sdist


FROM ${PYTHON_IMAGE} AS deps
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# /opt/relay (stage build) is on the environment's path through a .pth file in its site-packages.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))" > /tmp/site \
    && echo /opt/relay > "$(cat /tmp/site)/outbox-relay.pth" \
    && rm /tmp/site
ENV PATH=/opt/venv/bin:$PATH
COPY --from=requirements /deps/requirements.txt /deps/constraints.txt /deps/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c /deps/constraints.txt -r /deps/requirements.txt


FROM deps AS build
COPY --from=native /wheels /wheels
# Its console script's interpreter is /opt/venv/bin/python; its dependencies are in /opt/venv.
RUN pip install --no-cache-dir --no-index --no-deps --target /opt/relay /wheels/outbox_relay-*.whl


FROM deps AS spark-deps
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends maven openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=requirements /deps/spark.txt /deps/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -c /deps/constraints.txt -r /deps/spark.txt


FROM spark-deps AS spark-build
COPY --from=build /opt/relay /opt/relay
ENV RELAY_CACHE_DIR=/opt/outbox-relay-cache
# Maven's local repository is a cache mount: after a source change the jars resolve offline.
RUN --mount=type=cache,target=/root/.m2 python -m relay.dev.spark_jars


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
# The dependencies with PySpark first (they change only with the dependency lists), then the jars
# and the relay.
COPY --from=spark-deps /opt/venv /opt/venv
COPY --from=spark-build /opt/outbox-relay-cache /opt/outbox-relay-cache
COPY --from=build /opt/relay /opt/relay
ENV PATH=/opt/relay/bin:/opt/venv/bin:$PATH \
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
# The dependencies first (they change only with the dependency lists), then the relay: a thin layer.
COPY --from=deps /opt/venv /opt/venv
COPY --from=build /opt/relay /opt/relay
ENV PATH=/opt/relay/bin:/opt/venv/bin:$PATH \
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
