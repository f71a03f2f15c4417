"""The stand-in Kafka image's entrypoint: the apache/kafka image's KAFKA_* convention (prefix
dropped, lower case, `___` -> `-`, `__` -> `_`, `_` -> `.`), storage formatted with CLUSTER_ID once,
then the broker in the foreground."""

import os
import subprocess

SKIP = {"KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_VERSION"}
JVM = ["java", "-Xmx512m", "-Xms256m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
       "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", "/opt/kafka/libs/*"]


def prop(name: str) -> str:
    return name[len("KAFKA_"):].lower().replace("___", "-").replace("__", "\0").replace("_", ".").replace("\0", "_")


props = {prop(k): v for k, v in os.environ.items() if k.startswith("KAFKA_") and k not in SKIP}
path = "/opt/kafka/server.properties"
with open(path, "w") as f:
    f.writelines(f"{k}={v}\n" for k, v in sorted(props.items()))
log_dir = props.get("log.dirs", "/tmp/kraft-combined-logs").split(",")[0]
if not os.path.exists(os.path.join(log_dir, "meta.properties")):
    subprocess.run([*JVM, "kafka.tools.StorageTool", "format", "-t", os.environ["CLUSTER_ID"], "-c", path],
                   check=True)
os.execvp("java", [*JVM, "kafka.Kafka", path])
