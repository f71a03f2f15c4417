"""A relay message as a JetStream message: the subject is the topic, the data the Kafka value's
bytes, the headers the Kafka headers' names and values, with the aggregate id (Kafka's key) in
`relay_aggregate_id` and the event id as `Nats-Msg-Id` (the server drops a copy it stored within
the stream's duplicate window).

What NATS cannot carry unchanged makes the event poison, named (relay.core.handover.Refused): an invalid subject; a
header name outside HTTP's token characters; a header value that is not UTF-8, holds a line break
or starts or ends with white space (nats-py would trim or replace it, silently); more bytes of data
and headers than the server's max_payload.
"""

from __future__ import annotations

import re

from relay.core.handover import Refused
from relay.core.message import HEADER_AGGREGATE_ID, OutgoingMessage
from relay.nats.subjects import valid_subject

HEADER_MSG_ID = "Nats-Msg-Id"
# RFC 9110's token characters, the names nats-py accepts (it refuses others with BadHeaderError).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEAD_LINE = len(b"NATS/1.0\r\n") + len(b"\r\n")  # around the header lines


Headers = dict[str, str]


def to_nats(m: OutgoingMessage, max_payload: int) -> tuple[str, bytes, Headers]:
    """(subject, data, headers) of `m`; Refused naming what NATS cannot carry."""
    if not valid_subject(m.topic):
        raise Refused(f"subject {m.topic!r} is not one NATS accepts (an empty token, a wildcard or white space)")
    headers: Headers = {}
    size = _HEAD_LINE
    for name, raw in [*m.headers, (HEADER_AGGREGATE_ID, m.key), (HEADER_MSG_ID, m.event_id.encode())]:
        value = _header_value(name, raw)
        headers[name] = value
        size += len(name) + len(raw) + 4  # "name: value\r\n"
    size += len(m.value)
    if size > max_payload:
        raise Refused(
            f"message of {size} bytes (data and headers) exceeds the NATS server's max_payload ({max_payload})"
        )
    return m.topic, m.value, headers


def _header_value(name: str, raw: bytes) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise Refused(f"header name {name!r} is not one NATS headers can carry (letters, digits, !#$%&'*+-.^_`|~)")
    try:
        value = raw.decode()
    except UnicodeDecodeError as exc:
        raise Refused(f"header {name} holds bytes that are not UTF-8") from exc
    if "\r" in value or "\n" in value or value != value.strip():
        raise Refused(f"header {name} holds a line break or surrounding white space, which NATS headers cannot carry")
    return value
