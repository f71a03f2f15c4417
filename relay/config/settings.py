"""`Settings`, the one object users configure: the settings table (relay.config.table) read from
its sources (relay.config.sources), validated once, and split into each part's configuration
(relay.config.parts).

`Settings.load()` reads the sources and validates: `parts()` builds each part's small
configuration, and each checks its own values; a problem raises `ConfigError` naming the setting.
Only the wiring and the commands read Settings.

Judged against pydantic-settings: it would parse the three sources with types too, but not keep
every message and variable name as they are, and it would put pydantic into the light client's
installation; the parsing here is some sixty lines (relay.config.sources).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from relay.config.parts import PartConfigs, part_configs
from relay.config.sources import read_sources
from relay.config.table import SettingsTable, public_types
from relay.core.config import EXACTLY_ONCE
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.redact import register_secrets
from relay.ops.config import check_logging


class Settings(SettingsTable):
    """Everything the relay needs to run; immutable after `load()` (the table's fields, declared
    in relay.config.table), and each part's configuration made from it (`parts()`)."""

    # ---- the parts' configurations ------------------------------------------------------------

    def parts(self) -> PartConfigs:
        """Each part's own configuration, made from these settings and checked by the part
        (ConfigError names the setting); built once per Settings object. `relay.wiring` hands
        each part its own."""
        return self._parts

    @functools.cached_property
    def _parts(self) -> PartConfigs:
        return part_configs(self)

    def kafka_client_config(self) -> dict[str, str]:
        """The configuration of the relay's other Kafka clients (KafkaConfig.client_config)."""
        return self.parts().kafka.client_config()

    # ---- loading --------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        flags: Mapping[str, Any] | None = None,
        kafka_flags: Mapping[str, str] | None = None,
        config_file: str | None = None,
    ) -> Settings:
        """Merge the sources, parse and validate; raises ConfigError naming the bad setting."""
        values, kafka = read_sources(
            public_types(), os.environ if env is None else env, flags or {}, kafka_flags or {}, config_file
        )
        settings = cls(**values, kafka=kafka)
        register_secrets(settings.secrets())  # before validating: a refused value is masked too
        settings.validate()
        return settings

    def validate(self) -> None:
        """Check every part's configuration (each failure names the setting), the logging
        settings, and what no single part can: exactly-once mode needs one read in flight."""
        self.parts()
        check_logging(self.log_level, self.log_format)
        if self.delivery == EXACTLY_ONCE and self.broker == "kafka" and self.pipeline_depth != 1:
            raise ConfigError(
                env_name("pipeline_depth"),
                f"must be 1 with RELAY_DELIVERY=exactly-once (one Kafka transaction at a time), "
                f"got {self.pipeline_depth}",
            )
