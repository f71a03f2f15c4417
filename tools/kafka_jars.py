"""Print relay/dev/kafka_jars.py's KAFKA_JARS table for a Kafka version, from Maven's resolution.

For maintainers, when KAFKA_VERSION changes (Maven is needed here, and only here):

    python tools/kafka_jars.py 4.1.1 > /tmp/jars.txt   # then paste it into KAFKA_JARS

`mvn dependency:copy-dependencies` of tools/kafka-pom.xml (org.apache.kafka:kafka_2.13 and
slf4j-simple, runtime scope); each jar's group, artifact and version are read from its path in
Maven's local repository (~/.m2/repository, where the resolution put it), and each line carries
the jar's SHA-256.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from relay.dev.digests import sha256_of
from relay.dev.maven import copy_dependencies

POM = Path(__file__).resolve().parent / "kafka-pom.xml"


def main(version: str) -> int:
    local = Path.home() / ".m2" / "repository"
    with tempfile.TemporaryDirectory(prefix="kafka-jars-") as tmp:
        out = copy_dependencies(POM, Path(tmp) / "libs", {"kafka.version": version})
        for jar in sorted(out.glob("*.jar")):
            [cached] = [p for p in local.rglob(jar.name) if p.read_bytes() == jar.read_bytes()]
            version_dir = cached.parent
            artifact_dir = version_dir.parent
            group = artifact_dir.parent.relative_to(local).as_posix().replace("/", ".")
            print(f'    _jar("{group}", "{artifact_dir.name}", "{version_dir.name}", "{sha256_of(jar)}"),')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "4.1.1"))
