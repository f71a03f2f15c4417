"""Reading settings from their sources: a TOML file, the environment and command-line flags.

Pure parsing over the settings' declarations (names and types, handed in by `relay.config.table`):
which sources name which setting, each raw value turned into its type, and the one-line refusal of
anything unknown or malformed (ConfigError naming where it came from). Later sources win:
defaults < TOML file < environment < flags.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from relay.core.errors import ConfigError
from relay.core.names import ENV_PREFIX, KAFKA_ENV_PREFIX, env_name
from relay.core.namespace import Namespace, NamespaceError
from relay.core.redact import credential_values, register_secrets

# RELAY_ variables that are not settings: the file to read settings from, and where the project
# caches what it downloads (relay.cachedir; the pipeline image sets it). RELAY_DEV_*, RELAY_TEST_*
# and RELAY_BENCH_* belong to the dev stack, the tests and the benchmarks (skipped below).
_NOT_SETTINGS = frozenset({"RELAY_CONFIG_FILE", "RELAY_CACHE_DIR"})


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def read_sources(
    types: Mapping[str, type],
    env: Mapping[str, str],
    flags: Mapping[str, Any],
    kafka_flags: Mapping[str, str],
    config_file: str | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the sources give (`types`: each setting's name and type), parsed, and the Kafka
    properties; ConfigError names the source of an unknown setting or a malformed value."""
    values: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    path = config_file or env.get("RELAY_CONFIG_FILE")
    if path:
        file_values, file_kafka = _read_toml(path, types)
        values.update(file_values)
        kafka.update(file_kafka)
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key in _NOT_SETTINGS:
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in types:
            values[name] = (raw, key)
        elif key.startswith(KAFKA_ENV_PREFIX):
            kafka[key[len(KAFKA_ENV_PREFIX) :].lower().replace("_", ".")] = raw
        elif name.startswith(("dev_", "test_", "bench_")):
            continue  # read by the dev stack, the tests and the benchmarks, not the relay
        else:
            raise ConfigError(key, _unknown(name, types, env_name))
    for name, raw in flags.items():
        if raw is not None:
            values[name] = (raw, flag_name(name))
    kafka.update(kafka_flags)
    return {name: _parse(types[name], raw, source) for name, (raw, source) in values.items()}, kafka


def _parse(kind: type, raw: Any, source: str) -> Any:
    if isinstance(raw, kind):
        return raw
    if kind is bool:
        if str(raw).strip().lower() not in ("true", "false"):
            raise ConfigError(source, f"must be true or false, got {raw!r}")
        return str(raw).strip().lower() == "true"
    try:
        if kind is int:
            return int(str(raw).strip())
        if kind is float:
            return float(str(raw).strip())
        return str(raw)
    except ValueError as exc:
        raise ConfigError(source, f"must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from exc


def _read_toml(path: str, types: Mapping[str, type]) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError("RELAY_CONFIG_FILE", f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("RELAY_CONFIG_FILE", f"{path} is not valid TOML: {exc}") from exc
    kafka = {str(k): str(v) for k, v in data.pop("kafka", {}).items()}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in types:
            raise ConfigError(f"{path}: {key}", _unknown(str(key), types, str))
        values[key] = (value, f"{path}: {key}")
    return values, kafka


def _unknown(name: str, names: Iterable[str], spell: Callable[[str], str]) -> str:
    """The one-line refusal of an unknown setting: the closest known name (difflib), if any,
    spelled as the source spells it (`RELAY_OUTBOXES` in the environment, `outboxes` in TOML);
    never the whole list of known names."""
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return f"unknown setting; did you mean {spell(close[0])}?" if close else "unknown setting"


def parse_outboxes(text: str) -> tuple[Namespace, ...]:
    """RELAY_OUTBOXES as namespaces, in the order given; ConfigError names a malformed or repeated one."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    namespaces = []
    for name in names:
        try:
            namespace = Namespace.parse(name)
        except NamespaceError as exc:
            raise ConfigError(env_name("outboxes"), f"expected database.collection outboxes, got {name!r}") from exc
        if "$" in namespace.collection or namespace.collection.startswith("system."):
            raise ConfigError(env_name("outboxes"), f"not a collection an outbox can be: {name!r}")
        namespaces.append(namespace)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(env_name("outboxes"), f"lists {', '.join(repeated)} more than once")
    return tuple(namespaces)


def parse_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    """`KEY=VALUE` arguments of a repeatable flag, as a dict; a malformed one names the flag and
    its position, never its text (it may be a credential: `sasl.password S3cret`), and the value
    of a password-like key is registered for masking (relay.core.redact) at once."""
    pairs: dict[str, str] = {}
    for n, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                flag, f"expected KEY=VALUE, but item {n} of {flag} has no '=' before its value (not shown)"
            )
        pairs[key.strip()] = value
    register_secrets(v for key, value in pairs.items() for v in credential_values(key, value))
    return pairs
