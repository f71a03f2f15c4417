"""Clean-up's rules without servers: the retention setting, which candidates may go, and what
the TTL headroom turns into (relay.mongo.config, relay.mongo.housekeeping, relay.ops.outbox_checks)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from relay.config import Settings
from relay.core.errors import ConfigError
from relay.core.namespace import Namespace
from relay.mongo.config import parse_duration
from relay.mongo.housekeeping import deletable
from relay.ops.health import Health
from relay.ops.outbox_checks import OutboxMetrics, OutboxSeries


@pytest.mark.parametrize("text, seconds", [("", None), ("off", None), ("OFF", None), ("0", 0.0), ("3600", 3600.0),
                                           ("90s", 90.0), ("15m", 900.0), ("24h", 86400.0), ("7d", 604800.0),
                                           ("1.5h", 5400.0)])
def test_retention_reads_seconds_or_a_unit_and_off_by_default(text, seconds):
    assert parse_duration("outbox_retention", text) == seconds
    assert Settings().parts().cleanup.retention_s is None, "off by default"


@pytest.mark.parametrize("bad", ["-5", "2 weeks", "1w", "h", "forever"])
def test_a_bad_retention_names_the_setting(bad):
    with pytest.raises(ConfigError, match="RELAY_OUTBOX_RETENTION"):
        Settings(outbox_retention=bad).parts()


def test_a_bad_interval_or_threshold_names_its_setting():
    with pytest.raises(ConfigError, match="RELAY_OUTBOX_CHECK_INTERVAL_S"):
        Settings(outbox_check_interval_s=0).parts()
    with pytest.raises(ConfigError, match="RELAY_TTL_HEADROOM_WARN_S"):
        Settings(ttl_headroom_warn_s=-1).parts()


def test_only_candidates_not_found_after_the_position_are_deletable():
    assert deletable([1, 2, 3, 4], {2, 4}) == [1, 3]
    assert deletable([1, 2], {1, 2}) == [], "nothing the checkpoint does not cover"


def test_ttl_headroom_below_the_threshold_warns_once_and_degrades_readiness_until_it_recovers(caplog):
    health = Health(Settings().parts().observer.health)
    registry = CollectorRegistry()
    metrics = OutboxMetrics(OutboxSeries(registry), health, Namespace("app", "outbox"))

    def headroom() -> float | None:
        return registry.get_sample_value("relay_outbox_ttl_headroom_seconds", {"outbox": "app.outbox"})

    assert headroom() is None, "no sample before the first check finds a TTL index"
    with caplog.at_level("WARNING", logger="relay.outbox"):
        metrics.ttl_headroom(300.0, 600.0)
        metrics.ttl_headroom(250.0, 600.0)
    assert health.degraded is not None and "TTL headroom" in health.degraded
    assert [r.levelname for r in caplog.records] == ["WARNING"], "one WARN per crossing"
    assert headroom() == 250.0
    metrics.ttl_headroom(900.0, 600.0)
    assert health.degraded is None, "recovered: ready again without the warning"
    metrics.ttl_headroom(None, 600.0)
    assert health.degraded is None, "no TTL index: nothing to warn about"
    assert headroom() is None, "no TTL index (dropped): no sample, which an alert would read as none left"
