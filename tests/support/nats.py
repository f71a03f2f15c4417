"""Reading a JetStream stream from the tests: every message up to its end, decoded as the oracle
reads a Kafka topic (`read_stream`: one stream keeps one order, so every record is in "partition"
0 at its stream sequence), and the stream's state."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from harness.topics import REGISTRY, Record


def _run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def _connect(url: str, **auth: Any) -> Any:
    return await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, connect_timeout=5, **auth)


def read_stream(url: str, stream: str, subject: str = ">", timeout: float = 30, **auth: Any) -> list[Record]:
    """Every message of `stream` (on subjects matching `subject`) up to its last, decoded, in
    stream order; the raw NATS headers in `headers`, the stream sequence as `offset`."""

    async def read() -> list[Record]:
        nc = await _connect(url, **auth)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except NotFoundError:
                return []
            last = info.state.last_seq
            records: list[Record] = []
            if info.state.messages == 0:
                return records
            sub = await js.pull_subscribe(
                subject, stream=stream,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                                      inactive_threshold=30),
            )
            try:
                seq = 0
                while seq < last:
                    batch = await sub.fetch(1000, timeout=timeout)
                    for msg in batch:
                        seq = msg.metadata.sequence.stream
                        if msg.subject == subject or subject == ">" or _matches(subject, msg.subject):
                            records.append(_record(msg, seq))
                    if seq >= last:
                        break
            finally:
                await sub.unsubscribe()
            return records
        finally:
            await nc.close()

    return _run(read())


def _matches(filter_: str, subject: str) -> bool:
    from relay.nats.subjects import covers

    return covers(filter_, subject)


def _record(msg: Any, seq: int) -> Record:
    headers = dict(msg.headers or {})
    return Record(msg.subject, 0, seq, headers.get("relay_aggregate_id", ""), REGISTRY.decode(msg.data), headers)


def stream_info(url: str, stream: str, **auth: Any) -> Any:
    async def info() -> Any:
        nc = await _connect(url, **auth)
        try:
            return await nc.jetstream().stream_info(stream)
        finally:
            await nc.close()

    return _run(info())


def stream_size(url: str, stream: str, **auth: Any) -> int:
    """Messages stored in `stream` now (0 when it does not exist yet)."""
    try:
        return int(stream_info(url, stream, **auth).state.messages)
    except NotFoundError:
        return 0


def add_stream(url: str, name: str, subjects: list[str], duplicate_window: float = 120, **auth: Any) -> None:
    """Create a stream as an operator would (file storage)."""
    from nats.js.api import StorageType, StreamConfig

    async def add() -> None:
        nc = await _connect(url, **auth)
        try:
            await nc.jetstream().add_stream(StreamConfig(name=name, subjects=subjects, storage=StorageType.FILE,
                                                         duplicate_window=duplicate_window))
        finally:
            await nc.close()

    _run(add())
