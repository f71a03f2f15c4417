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


def test_the_jobs_credentials_are_masked_in_their_configuration_and_lines(monkeypatch):
    """--view-uri's password and a --kafka-option credential are registered for masking when the
    job reads its flags, and its configuration renders them masked (the JVM side:
    tests/integration/test_security_secrets.py)."""
    from relay.core.redact import scrub
    from relay.spark.materialize import _parser, config_from_args
    from relay.spark.session import JOB_CONF

    canary = "Canary-Spark-51e0"
    monkeypatch.delenv("RELAY_MONGODB_URI", raising=False)
    args = _parser().parse_args(["--output", "/tmp/lake", "--view-uri", f"mongodb://v:{canary}v@h:1/?replicaSet=rs0",
                                 "--kafka-option", f'sasl.jaas.config=x required password="{canary}j";'])
    cfg, _opts, _settings = config_from_args(args)
    assert canary not in repr(cfg) and "v:***@h:1" in repr(cfg.view)
    assert scrub(f"{canary}v and {canary}j") == "*** and ***"
    assert cfg.view is not None and cfg.view.uri.reveal().startswith(f"mongodb://v:{canary}v@")
    assert "jaas" in JOB_CONF["spark.sql.redaction.options.regex"] and "jaas" in JOB_CONF["spark.redaction.regex"]


def test_pipeline_help_lists_the_jobs_and_each_jobs_help_its_options(capsys):
    """`outbox-relay pipeline --help` is help (exit 0), not a missing-argument error; after a job
    name `--help` still reaches that job's own parser."""
    from relay.cli import main

    with pytest.raises(SystemExit) as done:
        main(["pipeline", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "{materialize,audit}" in out and "`pipeline JOB --help`" in out, out
    with pytest.raises(SystemExit) as done:
        main(["pipeline", "materialize", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: outbox-relay pipeline materialize") and "--output" in out
    with pytest.raises(SystemExit) as done:
        main(["pipeline"])
    assert done.value.code == 2 and "required: job" in capsys.readouterr().err
