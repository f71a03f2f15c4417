"""Stand-in server images for the compose stack (test set-up only), built once like the bases.

`mongo:7.0` and `apache/kafka:4.1.1` come from Docker Hub, which is not reachable here, so
docker-compose.yml takes its server images from MONGO_IMAGE and KAFKA_IMAGE (defaults: the public
ones) and the tests pass these: the mongod the tests run (relay.dev.mongodb: 6.0.27 and its
OpenSSL 1.1 libraries) with mongosh from npm, and a broker from the Kafka jars in the tests' Maven
cache (tests/containers/servers/).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from relay.dev.stack import default_mongod, kafka_libs
from tests.containers.bases import PYTHON_BASE, ensure_images
from tests.containers.engine import Engine

MONGO_STAND_IN = "localhost/outbox-relay-stand-in/mongo:6.0.27-wheel"
KAFKA_STAND_IN = "localhost/outbox-relay-stand-in/kafka:4.1.1-jars"
HERE = Path(__file__).resolve().parent / "servers"


def _context(ref: str, folder: Path) -> Path:
    """The build folder: the Containerfile and what it copies."""
    if ref == MONGO_STAND_IN:
        mongod = default_mongod()
        shutil.copy2(mongod.path, folder / "mongod")
        (folder / "lib").mkdir()  # the libraries it needs (OpenSSL 1.1), installed with ldconfig
        for library in mongod.libraries.iterdir() if mongod.libraries else ():
            shutil.copy2(library, folder / "lib" / library.name)
        shutil.copy2(HERE / "mongo.Containerfile", folder / "Containerfile")
    else:
        shutil.copytree(kafka_libs(), folder / "libs")
        for name in ("kafka.Containerfile", "kafka-run.py", "kafka-broker-api-versions.sh"):
            shutil.copy2(HERE / name, folder / ("Containerfile" if name.endswith("Containerfile") else name))
    return folder / "Containerfile"


def build_server(engine: Engine, ref: str) -> float:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="relay-stand-in-") as tmp:
        containerfile = _context(ref, Path(tmp))
        argv = ["buildah", "bud", "--quiet", "--isolation", "chroot", "--format", "docker", "--layers",
                "--build-arg", f"BASE={PYTHON_BASE}", "-t", ref, "-f", str(containerfile), tmp]
        done = subprocess.run(argv, capture_output=True, text=True, env=engine.environ(), timeout=1800)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr[-4000:])
    return time.monotonic() - start


def ensure_servers(engine: Engine, log: Callable[[str], None] | None = None) -> dict[str, str]:
    """MONGO_IMAGE and KAFKA_IMAGE for compose: the stand-ins (built when missing); {} with Docker."""
    if engine.kind == "docker":
        return {}
    ensure_images(engine, (MONGO_STAND_IN, KAFKA_STAND_IN), "stand-in server", build_server, log)
    return {"MONGO_IMAGE": MONGO_STAND_IN, "KAFKA_IMAGE": KAFKA_STAND_IN}
