"""The JetStream stream the relay publishes into, checked (or created) at start.

If the stream exists, the relay uses it as the operator made it and checks that its subject
filters cover every subject it will publish (each topic template's subjects, a placeholder filling
one token, and the dead-letter subject when poison events are dead-lettered), and, in exactly-once
mode, that its duplicate window outlasts the longest republish the relay can cause. If it does not
exist, the relay creates it (file storage, the templates' subjects with `>` from the first
placeholder on, the duplicate window of RELAY_NATS_DUPLICATE_WINDOW_S), unless
RELAY_NATS_CREATE_STREAM=false. Every refusal is one ConfigError naming what is missing and the
setting to change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from nats.aio.client import Client
from nats.js.api import StorageType, StreamConfig, StreamInfo
from nats.js.errors import NotFoundError
from nats.js.manager import JetStreamManager

from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.nats.config import NatsConfig
from relay.nats.subjects import covers, uncovered

log = logging.getLogger("relay")


async def ensure_stream(
    connection: Client,
    config: NatsConfig,
    patterns: Sequence[str],
    creating: Sequence[str],
    republish_s: float | None,
) -> StreamInfo:
    """The stream of `config`, created when missing with `creating` as its subjects; ConfigError
    when it misses one of `patterns` or (`republish_s`: exactly-once) its duplicate window is
    shorter than that."""
    jsm = connection.jsm()
    try:
        info = await jsm.stream_info(config.stream)
    except NotFoundError as exc:
        if not config.create_stream:
            raise ConfigError(
                env_name("nats_stream"),
                f"JetStream has no stream {config.stream} and RELAY_NATS_CREATE_STREAM=false: create it with "
                f"subjects {', '.join(creating)}",
            ) from exc
        return await _create(jsm, config, creating, max(config.duplicate_window_s, republish_s or 0.0))
    _check(info, config, patterns, republish_s)
    return info


async def _create(jsm: JetStreamManager, config: NatsConfig, subjects: Sequence[str], window: float) -> StreamInfo:
    info = await jsm.add_stream(
        StreamConfig(
            name=config.stream,
            subjects=list(subjects),
            storage=StorageType.FILE,
            duplicate_window=window,
            description="outbox-relay: events published from MongoDB outboxes",
        )
    )
    log.info(
        "created JetStream stream %s (subjects %s, duplicate window %g s)", config.stream, ", ".join(subjects), window
    )
    return info


def _check(info: StreamInfo, config: NatsConfig, patterns: Sequence[str], republish_s: float | None) -> None:
    """ConfigError when the operator's stream misses a subject, or is unfit for exactly-once."""
    filters = list(info.config.subjects or [])
    missing = uncovered(filters, patterns)
    if missing:
        raise ConfigError(
            env_name("nats_stream"),
            f"stream {config.stream} stores subjects {', '.join(filters) or '(none)'}, not {', '.join(missing)} "
            "that the relay publishes (RELAY_TOPIC_TEMPLATE): add them to the stream's subjects",
        )
    window = info.config.duplicate_window or 0.0
    if republish_s is not None and window < republish_s:
        raise ConfigError(
            env_name("delivery"),
            f"exactly-once needs stream {config.stream}'s duplicate window ({window:g} s) to be at least the "
            f"longest republish ({republish_s:g} s: RELAY_CHECKPOINT_INTERVAL_MS + RELAY_LEASE_TTL_S + "
            "RELAY_STANDBY_POLL_S + RELAY_NATS_ACK_TIMEOUT_MS, docs/nats.md): raise the stream's duplicate_window",
        )


async def stream_storing(connection: Client, subject: str) -> str | None:
    """The stream that stores `subject` (None: none does)."""
    try:
        return await connection.jsm().find_stream_name_by_subject(subject)
    except NotFoundError:
        return None


def stores(info: StreamInfo, subject: str) -> bool:
    """Whether the stream `info` stores `subject`."""
    return any(covers(f, subject) for f in info.config.subjects or [])
