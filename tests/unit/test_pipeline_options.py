"""The pipeline jobs' flags and the Kafka source options they become (pure logic, no Spark)."""

from __future__ import annotations

import pytest

from relay.core.errors import ConfigError
from relay.spark.decode import kafka_options
from relay.spark.options import job_parser, spark_options


def _options(*argv: str):
    return spark_options(job_parser("test", "test").parse_args(list(argv)))


def test_kafka_client_properties_reach_the_source_as_kafka_options():
    opts = _options("--kafka-option", "security.protocol=SASL_SSL", "--kafka-option", "sasl.mechanism=PLAIN",
                    "--spark-conf", "spark.ui.enabled=false", "--topics", "a, b")
    assert opts.kafka == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    assert opts.conf == {"spark.ui.enabled": "false"} and opts.topics == ("a", "b")
    assert kafka_options("k:9093", opts.topics, None, opts.kafka) == {
        "kafka.isolation.level": "read_committed", "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
        "kafka.bootstrap.servers": "k:9093", "includeHeaders": "true", "subscribe": "a,b"}


def test_the_relay_settings_win_over_a_kafka_option_for_the_bootstrap_servers():
    assert kafka_options("k:9093", None, "t\\..*", {"bootstrap.servers": "other:1"})["kafka.bootstrap.servers"] == "k:9093"


def test_the_source_reads_committed_transactions_only_unless_told_otherwise():
    assert kafka_options("k:9093", ("a",), None)["kafka.isolation.level"] == "read_committed"
    told = kafka_options("k:9093", ("a",), None, {"isolation.level": "read_uncommitted"})
    assert told["kafka.isolation.level"] == "read_uncommitted"


@pytest.mark.parametrize("flag", ["--kafka-option", "--spark-conf"])
def test_a_malformed_pair_names_its_flag(flag):
    with pytest.raises(ConfigError) as err:
        _options(flag, "no-equals-sign")
    assert err.value.setting == flag
