"""The outbox contract: the event document services write, its parser, and the writer.

`from relay import Outbox, AsyncOutbox, OutboxEvent` is the interface services use (`AsyncOutbox`
for asyncio services); `decode`, `parse` and `FieldNames` are what the relay reads documents with.
"""

from relay.outbox.event import (
    DEFAULT_FIELDS,
    DOCUMENT_CODEC,
    FieldNames,
    MalformedEventError,
    OutboxEvent,
    decode,
    parse,
)
from relay.outbox.writer import AsyncOutbox, Outbox

__all__ = [
    "DEFAULT_FIELDS",
    "DOCUMENT_CODEC",
    "AsyncOutbox",
    "FieldNames",
    "MalformedEventError",
    "Outbox",
    "OutboxEvent",
    "decode",
    "parse",
]
