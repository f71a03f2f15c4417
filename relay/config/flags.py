"""Command-line flags for every setting (the same names as the RELAY_* variables), shared by the
commands and the Spark jobs."""

from __future__ import annotations

import argparse

from relay.config.settings import Settings
from relay.config.sources import flag_name, parse_pairs
from relay.config.table import public_fields
from relay.core.names import env_name


def settings_parser() -> argparse.ArgumentParser:
    """Flags for every setting, as a parent parser: `argparse.ArgumentParser(parents=[settings_parser()])`."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("settings (each also RELAY_<NAME>)")
    for f in public_fields():
        group.add_argument(
            flag_name(f.name), dest=f.name, default=None, metavar="V", help=f"{f.metadata['help']} [{env_name(f.name)}]"
        )
    group.add_argument(
        "--kafka-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Kafka producer property, e.g. compression.type=zstd [RELAY_KAFKA_*]",
    )
    group.add_argument(
        "--config", dest="config_file", default=None, metavar="FILE", help="TOML file with settings [RELAY_CONFIG_FILE]"
    )
    return parent


def load_settings(args: argparse.Namespace) -> Settings:
    """Settings from defaults, file, environment and the flags of `settings_parser()` (validated)."""
    names = {f.name for f in public_fields()}
    flags = {k: v for k, v in vars(args).items() if k in names}
    kafka = parse_pairs(args.kafka_property, "--kafka-property")
    return Settings.load(flags=flags, kafka_flags=kafka, config_file=args.config_file)
