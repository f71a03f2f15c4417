"""Kafka messages as `InboxEvent`s, in both framings and both envelopes, as the relay writes them.

- Framing: Avro single-object encoding (the writer schema found in the schema folder by
  fingerprint, history included) or the Confluent wire format (the schema fetched from the
  Schema Registry by id), both through `relay.avro.framing.MessageDecoder`.
- Envelope: the generic one carries the payload as relaxed Extended JSON text, parsed here with
  `bson.json_util` into a dict (ObjectId, dates (UTC-aware), Decimal128 ... come back as BSON types); a typed
  one carries a record, returned as fastavro decodes it.

A value that cannot be decoded raises `UndecodableMessageError` naming why: the inbox treats it as
a poison event (`relay.inbox.poison`). That is a value the relay did not write, a single-object
value whose fingerprint the schema folder does not know (the folder must be as new as the
relay's: deploy new schemas to the consumers first), a Confluent value whose schema id the
registry does not hold. A registry that cannot be reached is not the value's fault:
SchemaRegistryUnavailableError propagates and the inbox decodes the batch again later
(relay.inbox.errors); one that refuses the inbox's requests (credentials, a URL that is not a
registry) raises SchemaRegistryRefusedError, which ends `run` (relay.avro.framing.decode_failure).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from bson import json_util
from bson.json_util import RELAXED_JSON_OPTIONS

from relay.avro.folder import SchemaFolder
from relay.avro.framing import MessageDecoder, registry_client
from relay.core.message import RESERVED_HEADER_PREFIXES
from relay.inbox.event import InboxEvent


class UndecodableMessageError(ValueError):
    """Raised when a Kafka message is not an event the relay wrote (framing, schema or envelope)."""


# Dates come back timezone-aware (UTC), as `occurred_at` and a tz_aware MongoClient give them.
_PAYLOAD_JSON = RELAXED_JSON_OPTIONS.with_options(tz_aware=True, tzinfo=dt.UTC)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def header_dict(headers: Sequence[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    """Kafka headers as text (the last value wins for a repeated name)."""
    return {name: _text(value) for name, value in headers or () if value is not None}


def _payload(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # the generic envelope: relaxed Extended JSON text
        parsed = json_util.loads(value, json_options=_PAYLOAD_JSON)
        if not isinstance(parsed, dict):
            raise UndecodableMessageError(f"payload is Extended JSON {type(parsed).__name__}, not a document")
        return parsed
    if isinstance(value, Mapping):
        return dict(value)
    raise UndecodableMessageError(f"payload is {type(value).__name__}, neither text nor a record")


def _occurred_at(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int):  # a schema without the logical type: milliseconds since the epoch
        return dt.datetime.fromtimestamp(value / 1000, dt.UTC)
    raise UndecodableMessageError(f"occurredAt is {type(value).__name__}, not a timestamp")


class EventDecoder:
    """Decodes the relay's messages; `schema_registry_url` (with `basic_auth`, USER:PASSWORD)
    enables the Confluent wire format."""

    def __init__(self, folder: SchemaFolder | None = None, schema_registry_url: str = "", basic_auth: str = "") -> None:
        client = registry_client(schema_registry_url, basic_auth) if schema_registry_url else None
        self._decoder = MessageDecoder(folder or SchemaFolder.bundled(), client)

    def decode(
        self, topic: str, partition: int, offset: int, value: bytes | None, headers: dict[str, str]
    ) -> InboxEvent:
        """The event in one message; raises UndecodableMessageError naming the problem (and the
        registry's errors as they are: the module docstring)."""
        if not value:
            raise UndecodableMessageError("the message has no value")
        try:
            record = self._decoder.decode(value, topic).record
            return InboxEvent(
                event_id=str(record["id"]),
                aggregate_type=str(record["aggregateType"]),
                aggregate_id=str(record["aggregateId"]),
                event_type=str(record["eventType"]),
                payload=_payload(record["payload"]),
                occurred_at=_occurred_at(record["occurredAt"]),
                headers={k: v for k, v in headers.items() if not k.startswith(RESERVED_HEADER_PREFIXES)} or None,
                topic=topic,
                partition=partition,
                offset=offset,
            )
        except UndecodableMessageError:
            raise
        except (ValueError, KeyError, TypeError, EOFError) as exc:
            raise UndecodableMessageError(f"{type(exc).__name__}: {exc}") from exc
