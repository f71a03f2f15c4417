"""docs/security.md's privilege and ACL tables say what the code requires (relay.mongo.privileges,
relay.kafka.acls), mode by mode."""

from __future__ import annotations

import re
from collections import defaultdict

from relay.core.namespace import Namespace
from relay.kafka.acls import SPARK_GROUP_PREFIX, TAIL_GROUP_PREFIX, required_to_consume, required_to_read
from relay.kafka.acls import required as required_acls
from relay.mongo.privileges import required as required_privileges
from tests.support.paths import ROOT

DOC = (ROOT / "docs" / "security.md").read_text()


def _section(title: str) -> str:
    return DOC.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _rows(section: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `") or line.startswith("| topic") or line.startswith("| the ")
            or line.startswith("| transactional") or line.startswith("| group")]


def _ticked(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def test_the_mongodb_table_lists_every_privilege_of_every_mode() -> None:
    documented: dict[str, set[str]] = defaultdict(set)
    for resource, actions, *_ in _rows(_section("Least privilege on MongoDB")):
        documented[resource.strip("`")] |= _ticked(actions)
    needed: dict[str, set[str]] = defaultdict(set)
    for cleanup in (False, True):
        for p in required_privileges("<db>", [Namespace("<db>", "<outbox>")], "<leases>", cleanup=cleanup, inbox="<inbox>"):
            needed[p.namespace] |= set(p.actions)
    assert documented == needed


def _acls(section: str) -> set[tuple[str, str, str, str]]:
    """(kind, name, pattern, operation) of every row: the name is the resource cell's first
    ticked word, e.g. outbox.event. in "topic `outbox.event.` (...)"."""
    documented = set()
    for resource, pattern, operations, *_ in _rows(section):
        kind = resource.split()[0].upper().replace("TRANSACTIONAL", "TRANSACTIONAL_ID")
        name = re.findall(r"`([^`]+)`", resource)[0]
        documented |= {(kind, name, pattern, op) for op in _ticked(operations)}
    return documented


def _as_tuples(acls) -> set[tuple[str, str, str, str]]:
    return {(a.resource, a.name, a.pattern, a.operation) for a in acls}


def test_the_kafka_tables_list_every_acl_of_every_mode_by_name() -> None:
    relay_part, readers = _section("Least privilege on Kafka").split("### Reading the topics", 1)
    readers, inbox = readers.split("### Consuming the topics", 1)
    assert _acls(inbox) == _as_tuples(required_to_consume(["outbox.event.order"], "shipping", "outbox.deadletter"))
    acls = required_acls("outbox.event.{aggregateType}", exactly_once=True, offsets_topic="outbox-relay.offsets",
                         dead_letter_topic="outbox.deadletter")
    assert _acls(relay_part) == _as_tuples(acls)
    tail = _as_tuples(required_to_read("outbox.event.{aggregateType}", TAIL_GROUP_PREFIX))
    spark = _as_tuples(required_to_read("outbox.event.{aggregateType}", SPARK_GROUP_PREFIX))
    assert _acls(readers) == tail | spark
