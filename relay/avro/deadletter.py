"""Dead letters: with RELAY_ON_POISON=dead-letter, a poison event goes to the dead-letter topic
with the reason, in its place in the stream; it is never dropped silently.

The value is the outbox document as canonical Extended JSON (it could not be Avro-encoded, so
it travels as JSON). Headers: `ce_id`, `relay_dead_letter_reason`, `relay_fencing_token`,
`relay_outbox` (database.collection) and `content-type: application/json`. If the document is
itself too large for the broker, its payload is replaced by a note with the payload's size and
`relay_dead_letter_truncated: true` is set; the full document stays in the outbox collection
under the id the message names.
"""

from __future__ import annotations

from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS

from relay.avro.config import EncodingConfig
from relay.core.change import Change
from relay.core.message import CONTENT_TYPE_JSON, HEADER_FENCING, OutgoingMessage, event_id_of
from relay.outbox import decode

HEADER_REASON = "relay_dead_letter_reason"
HEADER_TRUNCATED = "relay_dead_letter_truncated"
_ROOM = 4096  # left for key, headers and record overhead


def dead_letter_message(change: Change, reason: str, fencing_token: int, config: EncodingConfig) -> OutgoingMessage:
    """The dead-letter record standing in for a poison event: its outbox document, read from the
    change's bytes."""
    doc = decode(change.document)
    event_id = event_id_of(doc)
    aggregate_id = doc.get(config.fields.aggregate_id)
    key = (aggregate_id if isinstance(aggregate_id, str) and aggregate_id else event_id).encode()
    value = json_util.dumps(doc, json_options=CANONICAL_JSON_OPTIONS).encode()
    headers = [
        ("ce_id", event_id.encode()),
        (HEADER_REASON, reason.encode()[:2000]),
        (HEADER_FENCING, str(fencing_token).encode()),
        ("relay_outbox", str(config.outbox).encode()),
        ("content-type", CONTENT_TYPE_JSON),
    ]
    if len(value) > config.max_message_bytes - _ROOM:
        doc[config.fields.payload] = {"relay_truncated_bytes": len(value)}
        value = json_util.dumps(doc, json_options=CANONICAL_JSON_OPTIONS).encode()
        headers.append((HEADER_TRUNCATED, b"true"))
    return OutgoingMessage(event_id, config.dead_letter_topic, key, value, headers)
