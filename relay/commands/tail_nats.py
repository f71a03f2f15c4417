"""`outbox-relay tail SUBJECT` with RELAY_BROKER=nats: the messages of RELAY_NATS_STREAM on the
subjects SUBJECT matches (wildcards allowed), decoded, as JSON lines (relay.commands.tail's).

It reads through an ephemeral consumer of its own that acknowledges nothing (the stream and its
consumers are untouched). `--last N` starts at the stream's last N sequences (those on matching
subjects are printed: fewer when other subjects share the stream), `--from-beginning` at its first;
then it exits at the last sequence seen at start, or keeps printing (`--follow`) until Ctrl-C.
Each line holds the subject, the stream and its sequence, the time the stream stored it, the
aggregate id (`key`, from `relay_aggregate_id`), the headers, the trace context and the value.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from typing import Any, TextIO

from relay.avro.folder import SchemaFolder
from relay.avro.framing import MessageDecoder
from relay.commands.message_json import decoded_into, reading, to_json
from relay.config import Settings
from relay.core.message import HEADER_AGGREGATE_ID
from relay.core.redact import emit

_FETCH = 256
_IDLE_S = 0.5


def tail_subject(
    settings: Settings,
    subject: str,
    *,
    from_beginning: bool = False,
    last: int = 10,
    follow: bool = False,
    max_messages: int | None = None,
    out: TextIO | None = None,
    decoder: MessageDecoder | None = None,
    registry: SchemaFolder | None = None,
    outbox: str | None = None,
) -> int:
    """Print the stream's messages on `subject` to `out`; the exit code (2: no such stream). An
    unreachable server raises ServerUnreachableError (exit 3), refused credentials ConfigError."""
    source, decoder = reading(settings, outbox, decoder, registry)
    reader = _Reader(settings, subject, decoder, out or sys.stdout, source)
    try:
        return asyncio.run(reader.run(from_beginning, last, follow, max_messages))
    except KeyboardInterrupt:
        return 0


class _Reader:
    def __init__(
        self, settings: Settings, subject: str, decoder: MessageDecoder, out: TextIO, source: str | None
    ) -> None:
        self._config = settings.parts().nats
        self._subject, self._decoder, self._out, self._source = subject, decoder, out, source

    async def run(self, from_beginning: bool, last: int, follow: bool, max_messages: int | None) -> int:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        from relay.nats.client import connect

        connection = await connect(self._config)
        try:
            js, stream = connection.jetstream(), self._config.stream
            try:
                state = (await js.stream_info(stream)).state
            except NotFoundError:
                emit(f"outbox-relay tail: no stream {stream!r} at {self._config.servers}", sys.stderr)
                return 2
            if not follow and state.messages == 0:
                return 0
            start = state.first_seq if from_beginning else max(state.first_seq, state.last_seq - last + 1)
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(start, 1),
                                    ack_policy=AckPolicy.NONE, inactive_threshold=30)  # fmt: skip
            sub = await js.pull_subscribe(self._subject, stream=stream, config=config)
            try:
                await self._print(sub, state.last_seq, follow, max_messages)
            finally:
                await sub.unsubscribe()
            return 0
        finally:
            await connection.close()

    async def _print(self, sub: Any, end: int, follow: bool, max_messages: int | None) -> None:
        import nats.errors

        printed, seen = 0, 0
        while (follow or seen < end) and (max_messages is None or printed < max_messages):
            try:
                batch = await sub.fetch(_FETCH, timeout=_IDLE_S)
            except nats.errors.TimeoutError:
                if not follow:
                    return  # nothing more on these subjects up to the end
                continue
            for msg in batch:
                seen = msg.metadata.sequence.stream
                headers = dict(msg.headers or {})
                if self._source is not None and headers.get("ce_source") != self._source:
                    continue
                if max_messages is not None and printed >= max_messages:
                    return
                emit(json.dumps(self._line(msg, headers), ensure_ascii=False), self._out)
                printed += 1

    def _line(self, msg: Any, headers: dict[str, str]) -> dict[str, Any]:
        stored = msg.metadata.timestamp
        line: dict[str, Any] = {
            "subject": msg.subject,
            "stream": msg.metadata.stream,
            "sequence": msg.metadata.sequence.stream,
            "timestamp": to_json(stored.astimezone(dt.UTC)) if stored else None,
            "key": headers.get(HEADER_AGGREGATE_ID),
            "headers": headers,
        }
        return decoded_into(line, msg.data, msg.subject, self._decoder)
