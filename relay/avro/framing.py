"""How a value names its writer schema: Avro single-object encoding or the Confluent wire format.

- Single-object encoding (default): `C3 01`, the writer schema's 8-byte little-endian
  CRC-64-AVRO fingerprint, the Avro binary body. The schema folder is the registry.
- Confluent wire format (when `RELAY_SCHEMA_REGISTRY_URL` is set): byte 0, the 4-byte
  big-endian schema id from a Confluent Schema Registry, the Avro binary body. Schemas are
  registered (or looked up, with auto-registration off) under the subject the configured
  naming strategy gives, by confluent-kafka's `AvroSerializer`.

Either way the Avro body is the same bytes for the same record. `MessageDecoder` reads both
(for `outbox-relay tail` and for tests).

Registry failures are classified here: a network error or a 5xx/408/429 answer is transient
(the relay restarts from its checkpoint and retries); any other refusal (incompatible schema,
schema not registered with auto-registration off, bad credentials) stops the relay, since an
operator must act. Decoding is classified the same way (`decode_failure`): only a value the
registry can answer for and that still cannot be decoded (a schema id the registry does not
hold, a body that does not fit its schema) is a ValueError, the value's fault; a registry that
cannot be asked raises SchemaRegistryUnavailableError and one that refuses the request
SchemaRegistryRefusedError, neither of which says anything about the value. Every registry request is bounded (`REQUEST_TIMEOUT_S`, `MAX_RETRIES`): a
registry that accepts connections but never answers (paused, overloaded) becomes a transient
error after at most about 35 s instead of blocking the relay forever.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from relay.avro.config import SUBJECT_STRATEGIES, RegistryConfig
from relay.avro.folder import SchemaFolder
from relay.avro.wire import CONFLUENT, CONFLUENT_MAGIC, SINGLE_OBJECT, SINGLE_OBJECT_MAGIC
from relay.core.errors import SchemaRegistryRefusedError, SchemaRegistryUnavailableError
from relay.core.redact import Uri

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = [
    "CONFLUENT",
    "CONFLUENT_MAGIC",
    "SINGLE_OBJECT",
    "SINGLE_OBJECT_MAGIC",
    "SUBJECT_STRATEGIES",
    "ConfluentFraming",
    "Decoded",
    "Framing",
    "MessageDecoder",
    "SingleObjectFraming",
    "framing_for",
]
# Each HTTP request to the registry; without a timeout the client waits forever on a registry
# that accepts the connection but does not answer (e.g. a paused process).
REQUEST_TIMEOUT_S = 10.0
# The client's own retries (transport errors, 5xx/408/429) before the error reaches the relay,
# which then restarts from its checkpoint with backoff: worst case 3 x 10 s plus short waits.
MAX_RETRIES = 2

_clients: dict[tuple[str, str], Any] = {}
_clients_lock = threading.Lock()


class Framing(Protocol):
    """Turns a record into a Kafka value that identifies its writer schema."""

    name: str

    def encode(self, schema_name: str, record: Mapping[str, Any], topic: str) -> bytes:
        """The framed value; raises ValueError/TypeError when the record does not fit the schema."""
        ...


class SingleObjectFraming:
    """Avro single-object encoding with the folder's schemas (no registry server)."""

    name = SINGLE_OBJECT

    def __init__(self, registry: SchemaFolder) -> None:
        self._registry = registry

    def encode(self, schema_name: str, record: Mapping[str, Any], topic: str) -> bytes:
        return self._registry.encode(schema_name, record)


def registry_client(url: str, basic_auth: str = "") -> SchemaRegistryClient:
    """One client per (URL, credentials) in this process. `mock://<name>` URLs give
    confluent-kafka's in-memory mock registry, shared by everything in the process that uses the
    same URL (the relay's encoder and a test's or `tail`'s decoder)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = (url, basic_auth)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            conf: dict[str, Any] = {"url": url, "timeout": REQUEST_TIMEOUT_S, "max.retries": MAX_RETRIES}
            if basic_auth:
                conf["basic.auth.user.info"] = basic_auth
            client = SchemaRegistryClient.new_client(conf)
            _clients[key] = client
        return client


def subject_strategy(name: str) -> Any:
    """confluent-kafka's subject name strategy for `topic`, `record` or `topic-record`."""
    from confluent_kafka.schema_registry import (
        record_subject_name_strategy,
        topic_record_subject_name_strategy,
        topic_subject_name_strategy,
    )

    return {
        "topic": topic_subject_name_strategy,
        "record": record_subject_name_strategy,
        "topic-record": topic_record_subject_name_strategy,
    }[name]


def subject_for(strategy: str, topic: str, record_name: str) -> str:
    """The subject a value of `record_name` on `topic` is registered under."""
    return {"topic": f"{topic}-value", "record": record_name, "topic-record": f"{topic}-{record_name}"}[strategy]


class ConfluentFraming:
    """The Confluent wire format through confluent-kafka's `AvroSerializer` (one per schema)."""

    name = CONFLUENT

    def __init__(
        self,
        registry: SchemaFolder,
        client: SchemaRegistryClient,
        strategy: str = "topic-record",
        auto_register: bool = True,
    ) -> None:
        self._registry = registry
        self._client = client
        self._strategy = strategy
        self._conf = {"auto.register.schemas": auto_register, "subject.name.strategy": subject_strategy(strategy)}
        self._serializers: dict[str, Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: RegistryConfig, registry: SchemaFolder) -> ConfluentFraming:
        client = registry_client(config.url.reveal(), config.basic_auth.reveal())
        return cls(registry, client, config.subject_strategy, config.auto_register)

    def _serializer(self, schema_name: str) -> Any:
        serializer = self._serializers.get(schema_name)
        if serializer is None:
            from confluent_kafka.schema_registry.avro import AvroSerializer

            with self._lock:
                serializer = self._serializers.get(schema_name)
                if serializer is None:
                    text = json.dumps(self._registry.raw(schema_name))
                    serializer = AvroSerializer(self._client, text, conf=dict(self._conf))
                    self._serializers[schema_name] = serializer
        return serializer

    def encode(self, schema_name: str, record: Mapping[str, Any], topic: str) -> bytes:
        from confluent_kafka.schema_registry import SchemaRegistryError
        from confluent_kafka.serialization import MessageField, SerializationContext

        try:
            value = self._serializer(schema_name)(dict(record), SerializationContext(topic, MessageField.VALUE))
        except (ValueError, TypeError, OverflowError):
            raise  # the record does not fit the schema: the caller's poison event
        except SchemaRegistryError as exc:
            subject = subject_for(self._strategy, topic, schema_name)
            if transient_status(exc.http_status_code):
                raise SchemaRegistryUnavailableError(f"Schema Registry error for subject {subject}: {exc}") from exc
            raise SchemaRegistryRefusedError(
                f"the Schema Registry refused schema {schema_name} under subject {subject}: {exc} "
                "(RELAY_SCHEMA_REGISTRY_URL, RELAY_SCHEMA_REGISTRY_SUBJECT_STRATEGY, "
                "RELAY_SCHEMA_REGISTRY_AUTO_REGISTER)"
            ) from exc
        except Exception as exc:
            raise SchemaRegistryUnavailableError(
                f"cannot reach the Schema Registry at {Uri(str(self._client.config().get('url', '?')))}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        assert value is not None
        return bytes(value)


def framing_for(config: RegistryConfig, registry: SchemaFolder) -> Framing:
    """Confluent wire format when a Schema Registry URL is set, else single-object encoding."""
    if config.url:
        return ConfluentFraming.from_config(config, registry)
    return SingleObjectFraming(registry)


@dataclass(frozen=True)
class Decoded:
    """A decoded value: its framing, writer schema (full name and id or fingerprint), record."""

    framing: str
    schema: str
    schema_ref: str  # fingerprint (hex) for single-object, schema id for Confluent
    record: dict[str, Any]


class MessageDecoder:
    """Decodes values in either framing. Single-object values are resolved against the schema
    folder (by fingerprint, history included); Confluent values need a registry client."""

    def __init__(self, registry: SchemaFolder, client: SchemaRegistryClient | None = None) -> None:
        self._registry = registry
        self._client = client
        self._deserializer: Any = None
        self._names: dict[int, str] = {}

    @classmethod
    def from_config(cls, config: RegistryConfig, registry: SchemaFolder) -> MessageDecoder:
        client = registry_client(config.url.reveal(), config.basic_auth.reveal()) if config.url else None
        return cls(registry, client)

    def decode(self, value: bytes, topic: str = "") -> Decoded:
        """Decode one value; raises ValueError naming why it cannot be decoded, and for the
        Confluent wire format SchemaRegistryUnavailableError or SchemaRegistryRefusedError when
        the registry cannot be asked or refuses (`decode_failure`)."""
        if value[:2] == SINGLE_OBJECT_MAGIC:
            name, record = self._registry.decode_named(value)
            return Decoded(SINGLE_OBJECT, name, value[2:10].hex(), record)
        if len(value) >= 5 and value[0] == CONFLUENT_MAGIC:
            return self._decode_confluent(value, topic)
        raise ValueError("neither Avro single-object encoding (C3 01) nor the Confluent wire format (00)")

    def _decode_confluent(self, value: bytes, topic: str) -> Decoded:
        if self._client is None:
            raise ValueError("Confluent wire format, but no Schema Registry is configured (RELAY_SCHEMA_REGISTRY_URL)")
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        schema_id = int.from_bytes(value[1:5], "big")
        if self._deserializer is None:
            self._deserializer = AvroDeserializer(self._client)
        try:
            record = self._deserializer(value, SerializationContext(topic, MessageField.VALUE))
            if schema_id not in self._names:
                schema = self._client.get_schema(schema_id)
                self._names[schema_id] = _full_name(json.loads(schema.schema_str or "{}"))
        except Exception as exc:
            raise decode_failure(exc, schema_id, self._client) from exc
        return Decoded(CONFLUENT, self._names[schema_id], str(schema_id), record)


# The registry's answer for a schema id it does not hold (Confluent's: 40403; its mock's: 40400).
SCHEMA_NOT_FOUND = frozenset({40400, 40403})


def transient_status(status: int) -> bool:
    """Whether a registry answer is one a later request can succeed after (408, 429, 5xx, none)."""
    return status in (408, 429) or status >= 500 or status < 0


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The registry client's network errors: httpx's TransportError (httpx2's where the client
    uses it), and OSError."""
    found: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def decode_failure(exc: Exception, schema_id: int, client: Any) -> Exception:
    """What a failed Confluent decode means, as the error to raise (its cause is `exc`):

    - SchemaRegistryUnavailableError: the registry could not be asked (network error, timeout,
      408/429/5xx); the same value decodes once it answers;
    - SchemaRegistryRefusedError: it refused the request itself (bad credentials, a URL that is
      not a registry's); an operator must act, and the value may be fine;
    - ValueError: the value is at fault (a schema id the registry does not hold, a body that
      does not fit the schema).
    """
    from confluent_kafka.schema_registry import SchemaRegistryError

    where = f"schema id {schema_id}"
    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code
        if transient_status(status):
            return SchemaRegistryUnavailableError(f"Schema Registry error for {where}: {exc}")
        if status == 404 and exc.error_code in SCHEMA_NOT_FOUND:
            return ValueError(f"cannot decode with {where}: the Schema Registry has no such schema ({exc})")
        url = Uri(str(client.config().get("url", "?")))
        return SchemaRegistryRefusedError(f"the Schema Registry at {url} refused to give {where}: {exc}")
    if isinstance(exc, _transport_errors()):
        url = Uri(str(client.config().get("url", "?")))
        return SchemaRegistryUnavailableError(f"cannot reach the Schema Registry at {url}: {type(exc).__name__}: {exc}")
    return ValueError(f"cannot decode with {where}: {type(exc).__name__}: {exc}")


def _full_name(schema: Mapping[str, Any]) -> str:
    name = str(schema.get("name", "?"))
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"
