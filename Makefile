# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create the virtual environment, install the package with its extras, fetch the Kafka
# broker's jars from Maven Central (pinned files, no Maven), resolve the Spark connector jars
# with Maven, and fetch mongod 6.0.27 (with Debian 11's OpenSSL 1.1) and 6.0.5 (the
# oldest supported, for a smoke test) into ~/.cache/outbox-relay (once; later runs reuse them).

# cargo builds the compiled hot path (native/, relay._native); rustup installs it in ~/.cargo/bin.
export PATH := $(HOME)/.cargo/bin:$(PATH)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EVENTS ?= 300
# The broker `make demo` runs the relay against: kafka, nats (nats-server with JetStream) or rabbitmq
# (rabbitmq-server from Debian's packages); neither of the last two needs Java.
BROKER ?= kafka
PYTEST_ARGS ?=
# Server tests run side by side on this many workers (pytest-xdist; each worker starts its own
# MongoDB and Kafka; tests/conftest.py keeps the Spark and Schema Registry tests on one worker).
TEST_WORKERS ?= 3
BENCH_ARGS ?=

.PHONY: setup containers demo test soak test-fast lint bench dev-up dev-down docs dist dist-aarch64 clean

# relay/_native*.so goes first: a module of an older build under another name (before the stable
# ABI, _native.cpython-311-*.so) would be imported before the new _native.abi3.so.
$(STAMP): pyproject.toml constraints.txt native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	@command -v cargo >/dev/null || { echo "make: cargo (Rust) is needed to build relay._native from native/; install it with rustup: https://rustup.rs" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	rm -f relay/_native*.so
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,spark]'
	@$(PY) -c "import relay._native" || { echo "make: relay._native was not built (it is optional for pip: pip install -v -e . shows cargo's error)" >&2; exit 1; }
	touch $(STAMP)

setup: $(STAMP)
	$(PY) -m relay dev fetch
	$(PY) -m relay dev fetch --broker nats
	$(PY) -m relay dev fetch --broker rabbitmq
	$(PY) -m relay.dev.mongodb
	$(PY) -m relay.dev.spark_jars

demo: setup
	$(PY) -m relay demo --events $(EVENTS) --broker $(BROKER)

# Static checks: lint and format (ruff), types (mypy; strict on relay/core), the import rules
# (import-linter: the layers, relay/core free of drivers, no circles; pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check relay harness tests bench
	$(VENV)/bin/ruff format --check relay harness
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The container tests' engine, stand-in base images and both images (tests/containers/prepare.py):
# Docker when one works, else Debian's podman (installed with apt-get when root); the bases are
# built once and kept in the engine's image store; the relay and pipeline images are built on every
# run (cached layers: seconds unless the dependency lists changed), then unused images are removed.
# With no engine the container tests skip, saying why.
containers: $(STAMP)
	$(PY) -m tests.containers.prepare

test: setup lint containers
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20 $(PYTEST_ARGS)

# The second tier (docs/testing.md): only the soak-sized scenarios (marker `soak`), at full size
# (RELAY_SOAK=1: tests/support/soak.py). Run it before calling work on the loop, the reader,
# positions, leases, the inbox or exactly-once done.
soak: setup
	RELAY_SOAK=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m soak --durations=20 $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench.run $(BENCH_ARGS)

dev-up: setup
	$(PY) -m relay dev up

dev-down: setup
	$(PY) -m relay dev down

docs: $(STAMP)
	$(PY) tools/readme_table.py
	$(PY) tools/readme_snippets.py

# What services install (README, "Installing in a service"): the sdist and one wheel for CPython
# 3.11+ on x86_64 Linux with relay._native inside, tagged manylinux2014 (glibc 2.17), in dist/.
# Needs cargo and Python 3.11+ only, not the contributor environment (.venv): tools/build_wheel.py
# installs its own tools (build-constraints.txt: cargo-zigbuild, zig, auditwheel) into the cache
# folder, once. The Dockerfile runs the same script.
dist:
	$(PYTHON) tools/build_wheel.py --out dist

# The aarch64 wheel, on its own: Debian's rustc with its aarch64 standard library (relay.dev.aarch64:
# about 126 MB of pinned packages fetched into the cache once), run from the contributor environment;
# tested under qemu-user by tests/integration/test_aarch64_wheel.py.
dist-aarch64: $(STAMP)
	$(PY) -m relay.dev.aarch64 build --out dist

clean:
	rm -rf $(VENV) build dist *.egg-info
