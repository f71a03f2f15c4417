"""confluent-kafka's errors in the relay's terms.

Delivery errors that retrying can never fix make an event poison (`PERMANENT`); a fenced
transactional producer means a newer leader took over; a fatal error makes the producer
unusable; anything else is cured by a new producer and a restart from the resume point
(docs/faults.md, "Delivery errors"). Every translated error keeps librdkafka's as its cause.
"""

from __future__ import annotations

import re

from confluent_kafka import KafkaError, KafkaException

from relay.core.errors import (
    Action,
    ConfigError,
    DeliveryError,
    PermissionDeniedError,
    PoisonEventError,
    ProducerFatalError,
    kafka_env_name,
)

# Delivery errors that retrying the same message can never fix: the event is poison.
PERMANENT: dict[int, str] = {
    KafkaError.MSG_SIZE_TOO_LARGE: "larger than the broker accepts for this topic",
    KafkaError.INVALID_RECORD: "rejected by the broker as an invalid record",
    KafkaError.TOPIC_EXCEPTION: "the topic name is invalid",
}
# Refusals an operator cures by granting an ACL (docs/security.md): the relay stops naming the
# resource and the operation instead of restarting forever. Code -> (resource kind, operations).
AUTHORIZATION: dict[int, tuple[str, str]] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: ("TOPIC", "WRITE, DESCRIBE"),
    KafkaError.GROUP_AUTHORIZATION_FAILED: ("GROUP", "READ"),
    # An idempotent producer gets its producer id with WRITE on any topic (KIP-679): a principal
    # refused it holds WRITE on none of the relay's topics.
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: ("CLUSTER", "IDEMPOTENT_WRITE, or WRITE on the relay's topics"),
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ("TRANSACTIONAL_ID", "WRITE, DESCRIBE"),
}
# librdkafka names an aliased property by its canonical name; errors name what the user set.
_ALIASES = {
    "queue.buffering.max.ms": "linger.ms",
    "compression.codec": "compression.type",
    "message.send.max.retries": "retries",
    "request.required.acks": "acks",
    "metadata.broker.list": "bootstrap.servers",
}


def kafka_error(exc: KafkaException) -> KafkaError | None:
    """The `KafkaError` a `KafkaException` carries (None if it carries something else)."""
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def fenced(err: object) -> bool:
    """Whether a `KafkaError` says a newer producer with the same transactional.id fenced this one
    (librdkafka raises `_FENCED`; the broker answers PRODUCER_FENCED or, before KIP-588,
    INVALID_PRODUCER_EPOCH)."""
    codes = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    return isinstance(err, KafkaError) and err.code() in codes


def action_for(exc: BaseException) -> Action | None:
    """What the loop does after a confluent-kafka error that escaped its boundary's translation
    (None for anything else): a fenced transactional producer means a newer leader took over;
    abortable and fatal ones are cured by a new producer and a restart from the resume point."""
    if isinstance(exc, KafkaException):
        err = kafka_error(exc)
        if err is not None and err.code() in AUTHORIZATION:
            return Action.STOP  # an operator must grant an ACL
        return Action.FENCED if fenced(err) else Action.RESTART
    return None


def authorization_error(err: object, resource: str) -> PermissionDeniedError | None:
    """PermissionDeniedError naming `resource` (a topic, transactional id ...) and the operations
    the broker refused, when `err` is an authorization failure (AUTHORIZATION); else None."""
    if not isinstance(err, KafkaError) or err.code() not in AUTHORIZATION:
        return None
    kind, operations = AUTHORIZATION[err.code()]
    named = f"{kind} {resource}" if resource else kind
    refused = [(f"{operations} ({err.name()})", named)]
    return PermissionDeniedError.missing("Kafka", "the relay's principal", refused, "docs/security.md, Kafka ACLs")


def produce_error(exc: KafkaException, event_id: str) -> Exception:
    """The relay error for a failure of `produce()`/`poll()` while handing `event_id` over."""
    err = kafka_error(exc)
    denied = authorization_error(err, "")
    if denied is not None:
        return denied
    if err is not None and err.fatal():
        return ProducerFatalError(f"producer unusable: {err}")
    if err is not None and err.code() in PERMANENT:
        return PoisonEventError(event_id, PERMANENT[err.code()])
    return DeliveryError(event_id, err)


def config_error(exc: KafkaException) -> ConfigError:
    """ConfigError naming the RELAY_KAFKA_* setting librdkafka refused."""
    err = kafka_error(exc)
    text = err.str() if err is not None else str(exc)
    # librdkafka says e.g.: No such configuration property: "foo.bar"
    names = re.findall(r'"([a-z0-9_.]+)"', text)
    prop = _ALIASES.get(names[-1], names[-1]) if names else None
    setting = kafka_env_name(prop) if prop else "RELAY_KAFKA_*"
    return ConfigError(setting, f"Kafka client refused the configuration: {text}")
