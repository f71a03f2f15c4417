"""`outbox-relay tail TOPIC`: print a topic's messages as JSON lines, decoded, for operators.

Like `tail(1)`: the last `--last N` messages of each partition (or all, `--from-beginning`),
then exit once the ends seen at start are reached, or keep printing new messages (`--follow`)
until Ctrl-C. It reads with its own consumer group and commits nothing.

`--isolation` is the consumer's isolation level. The default, read_committed (librdkafka's
default, and what the Spark jobs use), shows what consumers of an exactly-once relay see: the
messages of committed Kafka transactions and every non-transactional one; its end is the last
stable offset (an open transaction holds it back). read_uncommitted also shows the messages of
aborted transactions (a killed or fenced exactly-once relay's), to look at what the broker holds.

Each line holds the Kafka coordinates, the key, the headers, the trace context (`trace`: the
W3C `traceparent` split into `traceId` and `spanId`, and `tracestate`; null without one), the framing (`single-object` or
`confluent`), the writer schema's full name and fingerprint or registry id, and the decoded
value as JSON: timestamps as RFC 3339 text, decimals as text (exact), bytes as base64. The
generic envelope's payload (Extended JSON text) is printed as the JSON it holds. A value that
cannot be decoded is printed with an `error` and its bytes in base64; tail goes on.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import uuid
from typing import Any, TextIO

from relay.avro.folder import SchemaFolder
from relay.avro.framing import MessageDecoder
from relay.commands.message_json import decoded_into, text_of, to_json
from relay.config import Settings
from relay.core.redact import emit
from relay.kafka.acls import TAIL_GROUP_PREFIX


def render(msg: Any, decoder: MessageDecoder) -> dict[str, Any]:
    """One consumed message as the JSON object tail prints."""
    _kind, millis = msg.timestamp()
    line: dict[str, Any] = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": to_json(dt.datetime.fromtimestamp(millis / 1000, dt.UTC)) if millis > 0 else None,
        "key": text_of(msg.key()),
        "headers": {k: text_of(v) for k, v in (msg.headers() or [])},
    }
    return decoded_into(line, msg.value(), msg.topic(), decoder)


ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


def consumer_config(settings: Settings, isolation: str = "read_committed") -> dict[str, Any]:
    """A consumer configuration for `settings`' cluster: the relay's client properties minus
    producer-only ones, a throw-away group, no commits, the given isolation level."""
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {isolation!r}")
    conf: dict[str, Any] = settings.kafka_client_config()
    conf.update(
        {
            "group.id": f"{TAIL_GROUP_PREFIX}{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    return conf


def tail(
    settings: Settings,
    topic: str,
    *,
    from_beginning: bool = False,
    last: int = 10,
    follow: bool = False,
    max_messages: int | None = None,
    out: TextIO | None = None,
    decoder: MessageDecoder | None = None,
    registry: SchemaFolder | None = None,
    isolation: str = "read_committed",
    outbox: str | None = None,
) -> int:
    """Print `topic`'s messages as JSON lines to `out`; returns the exit code (2: no such topic).
    With `outbox` (one of RELAY_OUTBOXES) only that outbox's events: those whose `ce_source` header
    is its CloudEvents source (RELAY_CE_SOURCE, when set, is every outbox's: then it filters
    nothing). An unreachable cluster raises ServerUnreachableError (exit 3), naming the setting; a
    refused ACL PermissionDeniedError (exit 2), naming the topic or group and the operation.
    With RELAY_BROKER=nats, `topic` is a subject (wildcards allowed) of RELAY_NATS_STREAM
    (relay.commands.tail_nats); with RELAY_BROKER=rabbitmq a binding key on RELAY_RABBITMQ_EXCHANGE,
    printed from now on through a queue of tail's own (relay.commands.tail_rabbitmq)."""
    parts = settings.parts()
    source = None
    if outbox is not None:
        [namespace] = settings.pick_outboxes(outbox)
        source = parts.encoding_for(namespace).cloudevents_source
    out = out or sys.stdout
    decoder = decoder or MessageDecoder.from_config(parts.registry, registry or SchemaFolder.bundled())
    if parts.broker == "nats":
        from relay.commands.tail_nats import tail_subject

        return tail_subject(settings, topic, from_beginning, last, follow, max_messages, out, decoder, source)
    if parts.broker == "rabbitmq":
        from relay.commands.tail_rabbitmq import tail_routing_key

        return tail_routing_key(settings, topic, from_beginning, max_messages, out, decoder, source)
    return _tail_topic(settings, topic, (from_beginning, last, follow, max_messages), out, decoder, isolation, source)


def _tail_topic(
    settings: Settings,
    topic: str,
    reading: tuple[bool, int, bool, int | None],
    out: TextIO,
    decoder: MessageDecoder,
    isolation: str,
    source: str | None,
) -> int:
    """`tail` of a Kafka topic: `reading` is (from_beginning, last, follow, max_messages)."""
    from confluent_kafka import Consumer

    from relay.kafka.admin import check_kafka

    from_beginning, last, follow, max_messages = reading
    check_kafka(settings.parts().kafka)
    consumer = Consumer(consumer_config(settings, isolation))
    try:
        meta = consumer.list_topics(topic, timeout=settings.connect_timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            emit(f"outbox-relay tail: no topic {topic!r} at {settings.parts().kafka.bootstrap_servers}", sys.stderr)
            return 2
        pending = _assign(consumer, topic, sorted(meta.partitions), from_beginning, last, settings.connect_timeout_s)
        _print(consumer, pending, decoder, out, follow, max_messages, None if source is None else source.encode())
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        consumer.close()


def _assign(
    consumer: Any, topic: str, partitions: list[int], from_beginning: bool, last: int, timeout_s: float
) -> set[tuple[int, int]]:
    """Assign each partition at its first message, or `last` before its end; the (partition,
    end offset) pairs that have messages to print."""
    from confluent_kafka import TopicPartition

    assignment, pending = [], set()
    for p in partitions:
        low, high = _watermarks(consumer, TopicPartition(topic, p), timeout_s)
        start = low if from_beginning else max(low, high - last)
        assignment.append(TopicPartition(topic, p, start))
        if start < high:
            pending.add((p, high))
    consumer.assign(assignment)
    return pending


def _print(
    consumer: Any,
    pending: set[tuple[int, int]],
    decoder: MessageDecoder,
    out: TextIO,
    follow: bool,
    max_messages: int | None,
    source: bytes | None = None,
) -> None:
    """Print messages until every pending partition reached its end (or forever with `follow`),
    at most `max_messages`; with `source`, only those whose `ce_source` header it is."""
    from confluent_kafka import KafkaError

    from relay.kafka.errors import Treat, translate, treatment

    printed = 0
    while (follow or pending) and (max_messages is None or printed < max_messages):
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            # The end of a partition (its last offsets may be transaction markers, never
            # delivered as messages; read_committed ends at the last stable offset), or a
            # transient error (librdkafka retries).
            if error.code() == KafkaError._PARTITION_EOF:
                pending = {(p, end) for p, end in pending if p != msg.partition()}
            elif treatment(error) is Treat.DENIED:
                raise translate(error, _reading(msg.topic() or "?"))
            continue
        if source is None or (dict(msg.headers() or []).get("ce_source") == source):
            emit(json.dumps(render(msg, decoder), ensure_ascii=False), out)
            printed += 1
        offset = msg.offset() or 0
        pending = {(p, end) for p, end in pending if not (p == msg.partition() and offset + 1 >= end)}


def _reading(topic: str) -> Any:
    """What tail does, for a refusal (relay.kafka.acls.required_to_read lists its ACLs)."""
    from relay.kafka.errors import Attempt

    needs = (("TOPIC", topic, "READ, DESCRIBE"), ("GROUP", f"{TAIL_GROUP_PREFIX}*", "READ"))
    return Attempt("read the topic (outbox-relay tail)", needs)


# Answers of a partition whose leader is still being elected (a topic just created, a broker
# restarting): asked again until the timeout.
_NOT_READY = ("NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART")


def _watermarks(consumer: Any, partition: Any, timeout_s: float) -> tuple[int, int]:
    """The partition's (low, high) offsets, asked again while its leader is not ready, for at
    most `timeout_s` (RELAY_CONNECT_TIMEOUT_S); then librdkafka's error."""
    from tenacity import wait_fixed

    from relay.core.retry import retrying
    from relay.kafka.errors import kafka_error

    def not_ready(exc: BaseException) -> bool:
        err = kafka_error(exc)
        return err is not None and (err.retriable() or err.name() in _NOT_READY)

    ask = retrying(not_ready, give_up_after_s=timeout_s, wait=wait_fixed(0.25))
    low, high = ask(consumer.get_watermark_offsets, partition, timeout=timeout_s)
    return int(low), int(high)
