"""The oracle (docs/faults.md): consume the topic and compare with the outbox. Every committed
outbox event is present; first occurrences per key follow commit order; duplicates appear only
in the replay window after the last checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.topics import Record, read_topic
from tests.support.waiting import wait_until
from tests.support.writes import Written


@dataclass
class Verdict:
    missing: set[str]
    unexpected: set[str]
    order_violations: list[str]
    duplicates: list[Record]
    first: dict[str, Record]


def check(records: list[Record], written: Written) -> Verdict:
    """Compare the topic with what was committed: loss, per-key commit order, duplicates."""
    first: dict[str, Record] = {}
    duplicates: list[Record] = []
    partition_of: dict[str, int] = {}
    for r in records:
        if r.id in first:
            duplicates.append(r)
        else:
            first[r.id] = r
        if partition_of.setdefault(r.key, r.partition) != r.partition:
            raise AssertionError(f"key {r.key} spread over partitions {partition_of[r.key]} and {r.partition}")
    violations = []
    for agg, ids in written.per_aggregate.items():
        seen = [first[i] for i in ids if i in first]
        offsets = [r.offset for r in seen]
        if offsets != sorted(offsets):
            violations.append(f"{agg}: first occurrences out of commit order (offsets {offsets[:10]}...)")
    return Verdict(missing=written.ids - set(first), unexpected=set(first) - written.ids,
                   order_violations=violations, duplicates=duplicates, first=first)


def written_after_first_of(records: list[Any], fencing: int) -> list[Any]:
    """Per Kafka partition, the records after the first one carrying `fencing` that carry another
    token: what an older writer got in after the new one had started (in offset order)."""
    late = []
    for partition in {r.partition for r in records}:
        in_partition = [r for r in records if r.partition == partition]
        first = next((r.offset for r in in_partition if r.fencing == fencing), None)
        if first is not None:
            late += [r for r in in_partition if r.offset > first and r.fencing != fencing]
    return late


def assert_complete_and_ordered(records: list[Record], written: Written) -> Verdict:
    verdict = check(records, written)
    assert not verdict.missing, f"{len(verdict.missing)} events lost, e.g. {sorted(verdict.missing)[:5]}"
    assert not verdict.unexpected, f"unexpected events {sorted(verdict.unexpected)[:5]}"
    assert not verdict.order_violations, verdict.order_violations[:5]
    return verdict


def all_published(env: Any, written: Written, timeout: float = 180) -> list[Record]:
    """Wait until every written event is in the topic; return the whole topic."""
    def done() -> list[Record] | None:
        records = read_topic(env.servers.kafka_bootstrap, env.topic())
        return records if {r.id for r in records} >= written.ids else None
    return wait_until(done, timeout, "every event in the topic", interval=1)
