"""The Apache Avro Java library as an independent decoder (tests/interop/java/AvroDecode.java).

`JavaDecoder.get()` resolves org.apache.avro:avro with Maven into
~/.cache/outbox-relay/interop/avro-<version>/lib once (the only network access; later runs
use the cache), compiles AvroDecode.java with javac into a folder named for the source's hash,
and runs it with `java`. Tests skip when Java or Maven is missing; a failed resolution fails.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from relay.dev.maven import MavenError, copy_dependencies, is_resolved
from relay.dev.stack import cache_dir

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
SOURCE = HERE / "java" / "AvroDecode.java"
AVRO_VERSION = "1.12.1"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (the Java interop test needs a JDK 17+ and Maven)")
    return path


def avro_jars() -> Path:
    """The Avro Java jars, resolved with Maven into the cache on first use."""
    libs = cache_dir() / "interop" / f"avro-{AVRO_VERSION}" / "lib"
    if is_resolved(libs):
        return libs
    _tool("mvn")
    try:
        return copy_dependencies(POM, libs, {"avro.version": AVRO_VERSION})
    except MavenError as exc:
        raise RuntimeError(f"Maven could not resolve org.apache.avro:avro:{AVRO_VERSION}:\n{exc}") from None


@dataclass(frozen=True)
class JavaDecoder:
    """Runs AvroDecode: schemas as arguments, base64 values on stdin, JSON lines out."""

    classpath: str

    @classmethod
    def get(cls) -> JavaDecoder:
        javac = _tool("javac")
        _tool("java")
        libs = avro_jars()
        jars = os.pathsep.join(str(p) for p in sorted(libs.glob("*.jar")))
        digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
        classes = libs.parent / f"classes-{digest}"
        if not (classes / "AvroDecode.class").exists():
            staging = libs.parent / f"classes.partial-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            proc = subprocess.run([javac, "-encoding", "UTF-8", "-cp", jars, "-d", str(staging), str(SOURCE)],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"javac failed:\n{proc.stderr}")
            if classes.exists():
                shutil.rmtree(classes)
            staging.rename(classes)
        return cls(os.pathsep.join([str(classes), jars]))

    def decode(self, values: Sequence[bytes], readers: Sequence[Path],
               writers: Sequence[Path] = ()) -> list[dict[str, Any]]:
        """One {"writer", "value"} (or {"error"}) per value, in order."""
        args = ["java", "-cp", self.classpath, "AvroDecode", "--reader", *map(str, readers)]
        if writers:
            args += ["--writer", *map(str, writers)]
        stdin = "".join(base64.b64encode(v).decode() + "\n" for v in values)
        proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"AvroDecode failed:\n{proc.stderr[-4000:]}"
        lines = [json.loads(line) for line in proc.stdout.split("\n") if line.strip()]  # not splitlines(): U+2028 etc.
        assert len(lines) == len(values), proc.stderr[-4000:]
        return lines
