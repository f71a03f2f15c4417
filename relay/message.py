"""The Kafka record the relay hands to the producer, and the names every record shares.

Kept free of other relay imports so that settings, encoding and dead letters can all use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The header that carries the lease's fencing token on every record (events and dead letters).
HEADER_FENCING = "relay_fencing_token"

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def valid_topic(name: str) -> bool:
    """Whether Kafka accepts `name` as a topic name (legal characters, 1-249 long, not . or ..)."""
    return bool(_TOPIC_NAME.match(name)) and name not in (".", "..")


@dataclass(slots=True)
class OutgoingMessage:
    """One Kafka record, ready for the producer."""

    event_id: str
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
