"""Outboxes whose events can land on one topic by accident (issue 42, docs/outboxes.md).

RELAY_TOPIC_TEMPLATE's default, `outbox.event.{aggregateType}`, names no outbox: two outboxes of
RELAY_OUTBOXES whose services use the same aggregate type (`order` in `shop` and in `billing`)
publish to one topic, and a consumer cannot tell their events apart. The relay cannot know the
aggregate types an outbox will hold, so the rule is decided from the settings alone, before any
event is read: two outboxes share topics when the template, with each outbox's `{database}` and
`{collection}` filled in, is the same text for both (any aggregate type they share lands on one
topic). The placeholder that would tell them apart is `{database}` when their databases differ,
else `{collection}`. `run` warns once at start; `status` lists them. The default stays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from relay.avro.config import EncodingConfig
from relay.core.names import env_name
from relay.core.namespace import Namespace
from relay.outbox import FieldNames


@dataclass(frozen=True)
class SharedTopics:
    """Outboxes (in the order listed) routing one aggregate type to one topic, the template they
    share with their own names filled in, and the placeholder missing."""

    outboxes: tuple[Namespace, ...]
    template: str
    missing: str

    @property
    def names(self) -> list[str]:
        """The outboxes' texts (`database.collection`), as the WARNING line and `status` show them."""
        return [str(n) for n in self.outboxes]

    def warning(self) -> str:
        """The one WARNING line `run` writes at start."""
        names = self.names
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        return (
            f"outboxes {listed} publish an aggregate type they share to one topic ({env_name('topic_template')} "
            f"gives {self.template} for each, without {self.missing}): a consumer cannot tell their events "
            f"apart; add {self.missing} to {env_name('topic_template')}, or give their aggregate types distinct names"
        )

    def as_status(self) -> dict[str, object]:
        return {"outboxes": self.names, "topicTemplate": self.template, "missingPlaceholder": self.missing}


def _filled(template: str, namespace: Namespace) -> str:
    config = EncodingConfig(
        outbox=namespace,
        fields=FieldNames(),
        topic_template=template,
        ce_source="",
        max_message_bytes=1,
        dead_letter_topic="outbox-relay.dead-letters",
    )
    return config.event_topic_template


def shared_topics(template: str, outboxes: Iterable[Namespace]) -> list[SharedTopics]:
    """Every group of two or more `outboxes` that `template` routes to the same topics (the module
    docstring), in the order the outboxes are listed."""
    groups: dict[str, list[Namespace]] = {}
    for namespace in outboxes:
        groups.setdefault(_filled(template, namespace), []).append(namespace)
    found = []
    for filled, names in groups.items():
        if len(names) < 2:
            continue
        databases = {n.database for n in names}
        found.append(SharedTopics(tuple(names), filled, "{database}" if len(databases) > 1 else "{collection}"))
    return found
