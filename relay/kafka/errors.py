"""confluent-kafka's errors in the relay's terms, translated once: here, by `translate`.

Every librdkafka or broker code the relay tells apart is in one table, `CODES`, with what it
means to the relay (docs/faults.md, "Delivery errors"; docs/security.md, Kafka ACLs):
- POISON: retrying the same message can never help: the event is poison (or, when the report
  was for a record batch, the batch is replayed one message per request to find it);
- DENIED: the broker refused an ACL: the relay stops (exit 2) naming the resource and the
  operations the step needs, which an operator grants;
- FENCED: a newer producer with the same transactional.id took over: back to standby;
- CONFIG: the broker refuses a setting: the relay stops naming it.
Any other code is a fatal error of the producer when librdkafka says so (ProducerFatalError),
else a failed delivery (DeliveryError); both restart from the resume point with a new producer.

The caller says what it was doing (`Attempt`): the step, the resources it acted on with the ACL
operations the step needs on each, and the event being handed over. Every translated error keeps
librdkafka's as its cause (the caller raises it `from` the exception).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException

from relay.core.errors import (
    Action,
    BatchRefusedError,
    ConfigError,
    DeliveryError,
    PermissionDeniedError,
    PoisonEventError,
    ProducerFatalError,
    ProducerFencedError,
    RelayError,
    ServerError,
)
from relay.core.names import kafka_env_name


class Treat(enum.Enum):
    """What a code in CODES means to the relay (the module docstring)."""

    POISON = "poison"
    DENIED = "denied"
    FENCED = "fenced"
    CONFIG = "config"


@dataclass(frozen=True)
class Code:
    """One row of CODES: the treatment, and what it says (a poison event's reason, the resource
    kind of a refusal, a refused setting's reason) with the setting it names (CONFIG)."""

    treat: Treat
    says: str
    setting: str = ""


# Every code the relay tells apart, by name. (Codes a step checks as part of its own flow are
# not failures and stay where they are read: _PARTITION_EOF, UNKNOWN_TOPIC_OR_PART and
# TOPIC_ALREADY_EXISTS in the offsets topic and `tail`, _ALL_BROKERS_DOWN in the reachability check.)
CODES: dict[int, Code] = {
    KafkaError.MSG_SIZE_TOO_LARGE: Code(Treat.POISON, "larger than the broker accepts for this topic"),
    KafkaError.INVALID_RECORD: Code(Treat.POISON, "rejected by the broker as an invalid record"),
    KafkaError.TOPIC_EXCEPTION: Code(Treat.POISON, "the topic name is invalid"),
    KafkaError.TOPIC_AUTHORIZATION_FAILED: Code(Treat.DENIED, "TOPIC"),
    KafkaError.GROUP_AUTHORIZATION_FAILED: Code(Treat.DENIED, "GROUP"),
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: Code(Treat.DENIED, "CLUSTER"),
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Code(Treat.DENIED, "TRANSACTIONAL_ID"),
    # librdkafka raises _FENCED; the broker answers PRODUCER_FENCED or, before KIP-588, INVALID_PRODUCER_EPOCH.
    KafkaError._FENCED: Code(Treat.FENCED, "fenced by librdkafka"),
    KafkaError.PRODUCER_FENCED: Code(Treat.FENCED, "fenced by the broker"),
    KafkaError.INVALID_PRODUCER_EPOCH: Code(Treat.FENCED, "an older producer epoch"),
    KafkaError.INVALID_TRANSACTION_TIMEOUT: Code(
        Treat.CONFIG,
        "more than the broker allows (transaction.max.timeout.ms); lower it, or RELAY_KAFKA_MESSAGE_TIMEOUT_MS "
        "which it follows by default",
        "transaction.timeout.ms",
    ),
}
CLUSTER = "kafka-cluster"  # the one CLUSTER resource's name

# librdkafka names an aliased property by its canonical name; errors name what the user set.
_ALIASES = {
    "queue.buffering.max.ms": "linger.ms",
    "compression.codec": "compression.type",
    "message.send.max.retries": "retries",
    "request.required.acks": "acks",
    "metadata.broker.list": "bootstrap.servers",
}


@dataclass(frozen=True)
class Attempt:
    """What the relay asked of Kafka when librdkafka failed, for `translate`: the step, the
    resources it acts on with the ACL operations it needs on each (`needs`: kind, name,
    operations; a refusal names the one of the refused kind), the event being handed over, and
    for a delivery report of a record batch its size (which event was refused is then unknown)."""

    step: str
    needs: tuple[tuple[str, str, str], ...] = ()
    event_id: str = "?"
    batch: int = 0


def producing(topics: Iterable[str], event_id: str = "?", batch: int = 0, step: str = "produce") -> Attempt:
    """Handing messages for `topics` to an idempotent producer, or their delivery reports: WRITE
    and DESCRIBE on each topic; an idempotent producer's id comes with WRITE on any topic (KIP-679),
    so a CLUSTER refusal means WRITE on none."""
    names = ", ".join(sorted(set(topics))) or "?"
    needs = (("TOPIC", names, "WRITE, DESCRIBE"), ("CLUSTER", CLUSTER, "IDEMPOTENT_WRITE, or WRITE on these topics"))
    return Attempt(step, needs, event_id, batch)


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The `KafkaError` a `KafkaException` carries: the one way to read a driver error's code
    (None for any other exception, or one that carries something else)."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return err if isinstance(err, KafkaError) else None


def describe(err: object) -> str:
    """A librdkafka error in one line, as every log and stop line names it: `NAME (code):
    message` (`KafkaError.name()`, `.code()`, `.str()`), for a KafkaError or the KafkaException
    carrying one; anything else as its text."""
    if isinstance(err, KafkaException):
        carried = kafka_error(err)
        err = carried if carried is not None else str(err)
    if isinstance(err, KafkaError):
        return f"{err.name()} ({err.code()}): {err.str()}"
    return str(err)


def relay_error(exc: KafkaException) -> RelayError:
    """The relay error for a confluent-kafka exception that escaped its boundary's translation
    (raise it `from exc`): a refused ACL or setting, a fencing, a fatal producer error as
    `translate` says; any other a ServerError (restart) naming it."""
    err = kafka_error(exc)
    if err is None:
        return ServerError(f"Kafka: {describe(exc)}")
    treat = treatment(err)
    if treat is not None or err.fatal():
        translated = translate(err, Attempt("talk to Kafka"))
        if isinstance(translated, RelayError) and not isinstance(translated, (PoisonEventError, BatchRefusedError)):
            return translated
    return ServerError(f"Kafka: {describe(err)}")


def has_code(exc: BaseException, code: int) -> bool:
    """Whether `exc` is a KafkaException carrying a KafkaError with `code`."""
    err = kafka_error(exc)
    return err is not None and err.code() == code


def treatment(err: object) -> Treat | None:
    """CODES' treatment of `err` (None: not a KafkaError, or a code not in the table)."""
    code = CODES.get(err.code()) if isinstance(err, KafkaError) else None
    return code.treat if code is not None else None


def fenced(err: object) -> bool:
    """Whether a `KafkaError` says a newer producer with the same transactional.id fenced this one."""
    return treatment(err) is Treat.FENCED


def action_for(exc: BaseException) -> Action | None:
    """What the loop does after a confluent-kafka error that escaped its boundary's translation
    (None for anything else): a refused ACL stops; a fenced transactional producer means a newer
    leader took over; abortable and fatal ones are cured by a new producer and a restart."""
    if not isinstance(exc, KafkaException):
        return None
    treat = treatment(kafka_error(exc))
    if treat is Treat.DENIED:
        return Action.STOP  # an operator must grant an ACL
    return Action.FENCED if treat is Treat.FENCED else Action.RESTART


def translate(err: object, attempt: Attempt) -> Exception:
    """The relay's error for librdkafka's `err` during `attempt` (CODES):
    PermissionDeniedError naming the refused resource and the operations the step needs on it;
    ProducerFencedError; ConfigError naming the setting; ProducerFatalError for any other fatal
    error; PoisonEventError for a message the broker will never take (BatchRefusedError when the
    report was for a record batch); else DeliveryError (restart from the resume point)."""
    if not isinstance(err, KafkaError):
        return DeliveryError(attempt.event_id, describe(err))
    code = CODES.get(err.code())
    if code is not None and code.treat is Treat.DENIED:
        return _denied(err, code.says, attempt)
    if code is not None and code.treat is Treat.FENCED:
        tid = next((name for kind, name, _ in attempt.needs if kind == "TRANSACTIONAL_ID"), "its transactional.id")
        return ProducerFencedError(
            f"{attempt.step}: a newer producer of {tid} took over (a newer leader initialized it, {err.name()}), "
            f"so this one may commit nothing more: {err.str()}"
        )
    if code is not None and code.treat is Treat.CONFIG:
        return ConfigError(kafka_env_name(code.setting), f"{code.says} ({err.name()})")
    if err.fatal():
        return ProducerFatalError(f"{attempt.step}: producer unusable: {describe(err)}")
    if code is not None and code.treat is Treat.POISON:
        if attempt.batch:
            return BatchRefusedError(
                f"the broker refused a record batch ({err.name()}: {code.says}); replaying it one message at a time",
                attempt.batch,
            )
        return PoisonEventError(attempt.event_id, f"{code.says} ({err.name()})")
    return DeliveryError(attempt.event_id, describe(err))


def _denied(err: KafkaError, kind: str, attempt: Attempt) -> PermissionDeniedError:
    """PermissionDeniedError naming what `attempt` needs on the refused kind of resource."""
    needed = [(name, operations) for k, name, operations in attempt.needs if k == kind]
    name, operations = needed[0] if needed else ("", "the operation of this step")
    resource = f"{kind} {name}" if name else kind
    refused = [(f"{operations} ({err.name()})", resource)]
    hint = f"docs/security.md, Kafka ACLs; refused to {attempt.step}"
    return PermissionDeniedError.missing("Kafka", "the relay's principal", refused, hint)


def config_error(exc: KafkaException) -> ConfigError:
    """ConfigError naming the RELAY_KAFKA_* setting librdkafka refused when building a client
    (a local refusal, before any broker is asked)."""
    err = kafka_error(exc)
    text = err.str() if err is not None else str(exc)
    # librdkafka says e.g.: No such configuration property: "foo.bar"
    names = re.findall(r'"([a-z0-9_.]+)"', text)
    prop = _ALIASES.get(names[-1], names[-1]) if names else None
    setting = kafka_env_name(prop) if prop else "RELAY_KAFKA_*"
    return ConfigError(setting, f"Kafka client refused the configuration: {text}")
