"""What the encoder and the framing take from the settings, checked where they are used."""

from __future__ import annotations

import string
from dataclasses import dataclass

from relay.core.errors import ConfigError
from relay.core.message import valid_topic
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.core.redact import Secret, Uri, hold_masked
from relay.outbox import FieldNames

TOPIC_FIELDS = ("aggregateType", "eventType")  # the event's own fields a topic template may name
OUTBOX_FIELDS = ("database", "collection")  # the outbox's, the same for all its events
SUBJECT_STRATEGIES = ("topic", "record", "topic-record")


@dataclass(frozen=True, kw_only=True)
class EncodingConfig:
    """How an outbox document of the outbox `outbox` becomes a Kafka message
    (relay.avro.encoding.MessageBuilder) or a dead letter (relay.avro.deadletter)."""

    outbox: Namespace  # its database and collection fill the topic template and the CloudEvents source
    fields: FieldNames
    topic_template: str
    ce_source: str  # CloudEvents source; empty: /outbox-relay/<database>/<collection>
    max_message_bytes: int
    dead_letter_topic: str

    def __post_init__(self) -> None:
        try:
            self.topic_template.format(**{k: "x" for k in (*TOPIC_FIELDS, *OUTBOX_FIELDS)})
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                env_name("topic_template"),
                f"bad placeholder {exc}; use {{aggregateType}}, {{eventType}}, {{database}} or {{collection}}",
            ) from exc
        if not valid_topic(self.dead_letter_topic):
            raise ConfigError(
                env_name("dead_letter_topic"), f"not a valid Kafka topic name: {self.dead_letter_topic!r}"
            )

    @property
    def event_topic_template(self) -> str:
        """The topic template with this outbox's `{database}` and `{collection}` filled in: what is
        left names only the event's own fields (TOPIC_FIELDS)."""
        parts = []
        for literal, field, spec, conversion in string.Formatter().parse(self.topic_template):
            parts.append(literal.replace("{", "{{").replace("}", "}}"))
            if field is None:
                continue
            if field in OUTBOX_FIELDS and not spec and not conversion:
                value = self.outbox.database if field == "database" else self.outbox.collection
                parts.append(value.replace("{", "{{").replace("}", "}}"))
            else:
                parts.append(
                    "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
                )
        return "".join(parts)

    @property
    def cloudevents_source(self) -> str:
        return self.ce_source or f"/outbox-relay/{self.outbox.database}/{self.outbox.collection}"


@dataclass(frozen=True, kw_only=True)
class RegistryConfig:
    """The Schema Registry (RELAY_SCHEMA_REGISTRY_*): with a URL, values use the Confluent wire
    format; without, Avro single-object encoding (relay.avro.framing). The URL and the basic auth
    render masked (`Uri`, `Secret`); `reveal()` is for the registry client only."""

    url: Uri
    subject_strategy: str
    auto_register: bool
    basic_auth: Secret

    def __post_init__(self) -> None:
        hold_masked(self, uris=["url"], secrets=["basic_auth"])
        if not isinstance(self.auto_register, bool):
            raise ConfigError(
                env_name("schema_registry_auto_register"), f"must be true or false, got {self.auto_register!r}"
            )
        for url in self.urls:
            if not url.reveal().startswith(("http://", "https://", "mock://")):
                raise ConfigError(
                    env_name("schema_registry_url"),
                    f"must be http://, https:// (or mock:// in tests) URLs, got {url}",
                )
        if self.subject_strategy not in SUBJECT_STRATEGIES:
            raise ConfigError(
                env_name("schema_registry_subject_strategy"),
                f"must be one of {', '.join(SUBJECT_STRATEGIES)}; got {self.subject_strategy!r}",
            )
        if self.basic_auth and ":" not in self.basic_auth.reveal():
            raise ConfigError(env_name("schema_registry_basic_auth"), "must be USER:PASSWORD")
        if self.basic_auth and any("@" in u.reveal().partition("://")[2].partition("/")[0] for u in self.urls):
            raise ConfigError(
                env_name("schema_registry_basic_auth"),
                "set, and RELAY_SCHEMA_REGISTRY_URL holds user info too: give the credentials once (the client refuses both)",
            )

    @property
    def urls(self) -> list[Uri]:
        return [Uri(u.strip()) for u in self.url.reveal().split(",") if u.strip()]
