"""The least Kafka ACLs the relay's principal needs, per mode (docs/security.md has the table).

- the topics (a PREFIXED pattern: the topic template up to its first placeholder, e.g.
  `outbox.event.`; the dead-letter topic with RELAY_ON_POISON=dead-letter): WRITE and DESCRIBE.
  WRITE on a topic is also what an idempotent producer needs (KIP-679: no IDEMPOTENT_WRITE on
  the cluster since Kafka 3.0). CREATE on them only if the relay is to create them (the broker's
  auto-creation); create them beforehand instead.
- exactly-once (RELAY_DELIVERY=exactly-once): the transactional ids (PREFIXED `outbox-relay:`,
  one per lease) WRITE and DESCRIBE; the offsets topic READ, WRITE, DESCRIBE and
  DESCRIBE_CONFIGS (the relay checks it is compacted), and CREATE if it does not exist yet
  (the relay creates it); the offsets topic's reader uses no consumer group offsets, only a
  throwaway group id, but librdkafka still asks the group coordinator for it: READ on the group
  prefix `outbox-relay-offsets-`.

Readers of the relay's topics (`required_to_read`): READ and DESCRIBE on the topics, and READ on
the prefix of their throwaway consumer groups: `outbox-relay-tail-` for `outbox-relay tail`,
`spark-kafka-` for the pipeline's Spark Kafka source (Spark's own group ids:
`spark-kafka-source-...` streaming, `spark-kafka-relation-...` batch); the pipeline's half is
written from Spark's defaults, not tested against a broker with ACLs.

An inbox consumer (`required_to_consume`, relay.inbox): READ and DESCRIBE on its topics, READ on
its consumer group (LITERAL: it commits its offsets there), and with on_poison=dead-letter WRITE
and DESCRIBE on the dead-letter topic (its idempotent producer gets its id with that WRITE).

`required()` returns them as plain tuples so the docs, the tests and an operator's tooling can
turn them into `kafka-acls` commands or confluent_kafka `AclBinding`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay.kafka.offsets_record import transactional_id

OFFSETS_GROUP_PREFIX = "outbox-relay-offsets-"
TAIL_GROUP_PREFIX = "outbox-relay-tail-"
SPARK_GROUP_PREFIX = "spark-kafka-"


@dataclass(frozen=True)
class Acl:
    """ALLOW `operation` on a resource (`TOPIC`, `GROUP`, `TRANSACTIONAL_ID`, `CLUSTER`) named
    `name`, matched LITERAL or PREFIXED."""

    resource: str
    name: str
    pattern: str
    operation: str


def topic_prefix(template: str) -> str:
    """The fixed start of every topic the template routes to (`outbox.event.{aggregateType}`:
    `outbox.event.`)."""
    return template.split("{", 1)[0]


def required(
    topic_template: str, *, exactly_once: bool, offsets_topic: str, dead_letter_topic: str | None = None
) -> list[Acl]:
    """The ACLs for these settings (the module docstring says why each)."""
    prefix = topic_prefix(topic_template)
    pattern = "PREFIXED" if prefix != topic_template else "LITERAL"
    out = [Acl("TOPIC", prefix, pattern, op) for op in ("WRITE", "DESCRIBE")]
    if dead_letter_topic and not dead_letter_topic.startswith(prefix):
        out += [Acl("TOPIC", dead_letter_topic, "LITERAL", op) for op in ("WRITE", "DESCRIBE")]
    if exactly_once:
        out += [Acl("TRANSACTIONAL_ID", transactional_id(""), "PREFIXED", op) for op in ("WRITE", "DESCRIBE")]
        ops = ("READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS", "CREATE")
        out += [Acl("TOPIC", offsets_topic, "LITERAL", op) for op in ops]
        out.append(Acl("GROUP", OFFSETS_GROUP_PREFIX, "PREFIXED", "READ"))
    return out


def required_to_read(topic_template: str, group_prefix: str) -> list[Acl]:
    """The ACLs of a reader of the relay's topics whose consumer groups start with `group_prefix`
    (TAIL_GROUP_PREFIX, SPARK_GROUP_PREFIX): READ and DESCRIBE on the topics, READ on the groups."""
    prefix = topic_prefix(topic_template)
    pattern = "PREFIXED" if prefix != topic_template else "LITERAL"
    return [Acl("TOPIC", prefix, pattern, op) for op in ("READ", "DESCRIBE")] + [
        Acl("GROUP", group_prefix, "PREFIXED", "READ")
    ]


def required_to_consume(topics: Sequence[str], group_id: str, dead_letter_topic: str | None = None) -> list[Acl]:
    """The ACLs of an inbox consumer of `topics` in group `group_id` (`dead_letter_topic`: with
    on_poison=dead-letter): see the module docstring."""
    out = [Acl("TOPIC", topic, "LITERAL", op) for topic in topics for op in ("READ", "DESCRIBE")]
    out.append(Acl("GROUP", group_id, "LITERAL", "READ"))
    if dead_letter_topic:
        out += [Acl("TOPIC", dead_letter_topic, "LITERAL", op) for op in ("WRITE", "DESCRIBE")]
    return out
