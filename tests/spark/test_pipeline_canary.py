"""The pipeline's part of the canary test (tests/integration/test_security_secrets.py): `pipeline
audit` run with a MongoDB URI, a Kafka option (a JAAS configuration) and a Spark setting that hold
canaries, at DEBUG in JSON. Everything written to stdout and stderr (the job's lines,
py4j's record of every command it sent the JVM, Kafka options included, Spark's own log and the
report) is searched for them. It runs in the session's SparkSession (a JVM started once for the
Spark tests), so its cost is the audit's jobs, not a JVM start.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from relay.core.namespace import Namespace
from relay.mongo.privileges import required
from relay.spark import audit as audit_job
from tests.integration.test_security_secrets import CANARIES, JAAS, SECRET_ENV, URI_OPTIONS, assert_clean
from tests.security_servers import AuthMongo, auth_mongo
from tests.support.writes import write_events


@pytest.fixture(scope="module")
def mongo() -> Iterator[AuthMongo]:
    with auth_mongo(tls=True) as server:
        yield server


def test_the_pipeline_prints_no_credential(env, spark, mongo: AuthMongo, monkeypatch, capfd) -> None:
    fmt = "json"  # the text format passes the same scrub (the relay's commands run in both)
    db_name = env.settings.database
    with mongo.admin() as admin:
        write_events(admin[db_name], "outbox", 5, writers=1)
    role = required(db_name, [Namespace(db_name, "outbox")], "outbox_relay_leases", cleanup=False)
    uri = mongo.user_with(f"pipecanary{fmt}", CANARIES[1], role) + URI_OPTIONS
    for key, value in {**SECRET_ENV, "RELAY_MONGODB_URI": uri, "RELAY_DATABASE": db_name, "RELAY_LOG_LEVEL": "DEBUG",
                       "RELAY_LOG_FORMAT": fmt, "RELAY_KAFKA_BOOTSTRAP_SERVERS": env.servers.kafka_bootstrap,
                       "RELAY_TOPIC_TEMPLATE": env.settings.topic_template}.items():
        monkeypatch.setenv(key, value)
    # (tests/conftest.py restores the logging the job sets up: its handler, py4j at DEBUG)
    code = audit_job.main(["--master", "local[2]", "--shuffle-partitions", "2", "--json", "-",
                           "--kafka-option", f"sasl.jaas.config={JAAS}",
                           "--spark-conf", f"spark.hadoop.fs.s3a.secret.key={CANARIES[11]}"])
    out = "".join(capfd.readouterr())
    assert code == 4 and '"missing"' in out, f"exit {code}\n{out[-5000:]}"  # 5 events, no topic: all missing
    assert "py4j" in out  # the bridge's DEBUG lines were there to search
    assert_clean(f"pipeline audit ({fmt})", out)
