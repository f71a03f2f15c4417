"""Settings, by job: the table of settings (`table`), reading them from their sources (`sources`),
each part's configuration built from the table (`parts`), the object users load from both
(`settings`), the command-line flags (`flags`) and the README's table (`doc`). Importers use the
names below."""

from __future__ import annotations

from relay.config.doc import SETTINGS_DOC, markdown_table
from relay.config.flags import load_settings, settings_parser
from relay.config.parts import PartConfigs
from relay.config.settings import Settings
from relay.config.sources import flag_name, parse_outboxes, parse_pairs
from relay.core.names import env_name, kafka_env_name

__all__ = [
    "SETTINGS_DOC",
    "PartConfigs",
    "Settings",
    "env_name",
    "flag_name",
    "kafka_env_name",
    "load_settings",
    "markdown_table",
    "parse_outboxes",
    "parse_pairs",
    "settings_parser",
]
