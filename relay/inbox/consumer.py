"""The Kafka side: a consumer in the group that hands out batches and commits what was applied.

Contracts:
- `isolation.level=read_committed` (the messages of the relay's aborted Kafka transactions are
  never seen) and `enable.auto.commit=false`: offsets move only through `commit`, which the inbox
  calls after the batch's MongoDB transaction committed (relay.inbox.config forces both).
- Rebalances happen only inside `gather` (librdkafka runs the callbacks inside `consume`), never
  while a batch is being applied. On a revocation (or a lost assignment) the messages of the
  revoked partitions are dropped from the batch being gathered (`batching.without_partitions`),
  so nothing is applied or committed for a partition this consumer lost; the new owner reads them
  from the committed offset.
- A partition of a topic the consumer did not subscribe to (a group id shared with consumers of
  other topics) is warned about once per topic, naming the group and the topic.
- A failed offset commit is logged and ignored: the events stay recorded in the inbox, so the
  consumer that reads them again skips them.
- `lags()`: per assigned partition, librdkafka's `consumer_lag` from its statistics (every
  `statistics.interval.ms`, 5 s by default: the last stable offset minus the group's committed
  offset, known once the group committed one); a revoked partition is dropped at once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from relay.inbox.batching import BatchLimits, Gathering, without_partitions
from relay.inbox.config import RunOptions
from relay.inbox.decoding import header_dict
from relay.kafka.errors import Attempt, Treat, kafka_error, translate, treatment

log = logging.getLogger("relay.inbox")


class Stopping(Protocol):
    """What `gather` reads between polls (relay.inbox.stopping.StopSignal, or a threading.Event)."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class Received:
    """One consumed message, detached from librdkafka's object."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    raw_headers: list[tuple[str, str | bytes | None]]

    @classmethod
    def of(cls, msg: Message) -> Received:
        given = msg.headers() or []
        raw = list(given.items()) if isinstance(given, dict) else list(given)
        return cls(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0), msg.key(), msg.value(), raw)

    @property
    def headers(self) -> dict[str, str]:
        return header_dict(self.raw_headers)


class KafkaSource:
    """The group's consumer: `gather` a batch, `commit` its offsets, `close` on the way out."""

    def __init__(self, options: RunOptions) -> None:
        self._options = options
        self._batch: list[Received] = []
        self._assigned: set[tuple[str, int]] = set()
        self._foreign: set[str] = set()  # topics not subscribed to that were assigned, warned once
        self._lags: dict[tuple[str, int], int] = {}
        self._consumer = Consumer({**options.consumer_config(), "stats_cb": self._on_stats})
        self._consumer.subscribe(
            list(options.topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned |= {(p.topic, p.partition) for p in partitions}
        log.info("assigned %s", _names(partitions), extra={"partitions": _names(partitions)})
        self._warn_foreign(partitions)

    def _warn_foreign(self, partitions: list[TopicPartition]) -> None:
        """One WARNING per topic, the first time the group hands this consumer a partition of a
        topic it did not subscribe to (its group id is shared with consumers of other topics: the
        group's leader assigned by their subscriptions). Its messages are handled like the others."""
        group = self._options.group_id
        for topic in sorted({p.topic for p in partitions} - set(self._options.topics) - self._foreign):
            self._foreign.add(topic)
            log.warning(
                "group %s assigned this inbox a partition of %s, a topic it did not subscribe to (%s): the group id "
                "is shared with consumers of other topics; give each service its own group_id",
                group,
                topic,
                ", ".join(self._options.topics),
                extra={"group": group, "topic": topic},
            )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {(p.topic, p.partition) for p in partitions}
        self._assigned -= lost
        self._lags = {k: v for k, v in self._lags.items() if k not in lost}
        before = len(self._batch)
        self._batch[:] = without_partitions(self._batch, lost)
        log.info(
            "revoked %s; %d messages of them dropped from the batch being gathered",
            _names(partitions),
            before - len(self._batch),
            extra={"partitions": _names(partitions)},
        )

    def gather(self, limits: BatchLimits, stop: Stopping) -> list[Received]:
        """The next batch, in delivery order; [] after an idle poll or when `stop` is set first.

        Closes at `limits` (count, or time since the first message) or when a poll returns nothing
        (`batching.Gathering`). Runs the rebalance callbacks (inside `consume`).
        """
        self._batch = []
        gathering = Gathering(limits, self._options.poll_timeout_s)
        while not stop.is_set():
            timeout = gathering.wait(len(self._batch), time.monotonic())
            if timeout is None:
                break
            messages = self._consumer.consume(limits.room(len(self._batch)), timeout)
            for msg in messages:
                if msg.error() is None:
                    self._batch.append(Received.of(msg))
                else:
                    self._consumer_error(msg.error(), msg.topic())
            if not gathering.polled(len(self._batch), len(messages), time.monotonic()):
                break
        return self._batch

    def commit(self, offsets: dict[tuple[str, int], int]) -> bool:
        """Commit `offsets` (next offset to read per partition) synchronously; False if it failed."""
        if not offsets:
            return True
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
            )
        except KafkaException as exc:
            error = kafka_error(exc)
            if treatment(error) is Treat.DENIED:
                raise translate(error, self._consuming(", ".join(sorted({t for t, _ in offsets})))) from exc
            log.warning("offset commit failed (redelivered events will be skipped): %s", exc, extra={"cause": str(exc)})
            return False
        return True

    def _consumer_error(self, error: Any, topic: str | None) -> None:
        """End of a partition: nothing; a refused ACL: PermissionDeniedError naming the topic or
        the group and the operation (an operator must grant it); fatal: raised; else logged
        (librdkafka retries)."""
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if treatment(error) is Treat.DENIED:
            raise translate(error, self._consuming(topic or ", ".join(self._options.topics)))
        if error.fatal():
            raise KafkaException(error)
        log.warning("consumer error: %s", error, extra={"cause": str(error)})

    def _consuming(self, topics: str) -> Attempt:
        """What the consumer does, for a refusal (relay.kafka.acls.required_to_consume lists its ACLs)."""
        needs = (("TOPIC", topics, "READ, DESCRIBE"), ("GROUP", self._options.group_id, "READ"))
        return Attempt("consume (relay.inbox)", needs)

    def _on_stats(self, text: str) -> None:
        try:
            self._lags = partition_lags(json.loads(text), self._assigned)
        except (ValueError, TypeError, AttributeError) as exc:
            log.debug("unreadable librdkafka statistics: %s", exc)

    def lags(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> lag, for the assigned partitions whose lag is known."""
        return {k: v for k, v in self._lags.items() if k in self._assigned}

    def close(self) -> None:
        """Leave the group (the partitions go to the other members at once)."""
        self._consumer.close()


def partition_lags(stats: Mapping[str, Any], assigned: Collection[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The `consumer_lag` of each assigned partition in librdkafka's statistics (-1, unknown, left out)."""
    lags: dict[tuple[str, int], int] = {}
    for topic, numbers in stats.get("topics", {}).items():
        for number, partition in numbers.get("partitions", {}).items():
            key = (topic, int(number))
            if key in assigned and int(partition.get("consumer_lag", -1)) >= 0:
                lags[key] = int(partition["consumer_lag"])
    return lags


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{p.topic}[{p.partition}]" for p in partitions]
