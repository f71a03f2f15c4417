"""`outbox-relay tail ROUTING_KEY` with RELAY_BROKER=rabbitmq: the messages published to
RELAY_RABBITMQ_EXCHANGE whose routing key the binding key ROUTING_KEY matches (`*` one word, `#`
any), decoded, as JSON lines (relay.commands.tail's).

It reads through a queue of its own: server-named, exclusive and auto-delete, bound to the exchange
with ROUTING_KEY, so it takes nothing from the operator's queues (RabbitMQ gives every bound queue
its own copy) and RabbitMQ deletes it when tail ends. A queue holds no history: tail prints the
messages published from the moment it is bound, until Ctrl-C or `--max-messages` (it always
follows; `--last` does not apply), and refuses `--from-beginning` with one line (exit 2). Each line
holds the exchange, the routing key, the message id (the event id), the time the relay published
it (AMQP's `timestamp`, seconds), the aggregate id (`key`, from `relay_aggregate_id`), the headers,
the trace context and the value.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from typing import Any, TextIO

from relay.avro.framing import MessageDecoder
from relay.commands.message_json import decoded_into, to_json
from relay.config import Settings
from relay.core.errors import ServerUnreachableError
from relay.core.message import HEADER_AGGREGATE_ID
from relay.core.redact import emit

FROM_BEGINNING = (
    "outbox-relay tail: --from-beginning is not available with RELAY_BROKER=rabbitmq: a queue keeps no history; "
    "tail prints the messages published from now on, through a queue of its own"
)
_IDLE_S = 0.5

Delivery = tuple[Any, Any, bytes]  # pika's method, properties, body


def tail_routing_key(
    settings: Settings,
    routing_key: str,
    from_beginning: bool,
    max_messages: int | None,
    out: TextIO,
    decoder: MessageDecoder,
    source: str | None,
) -> int:
    """Print the exchange's messages matching `routing_key` to `out` from now on (`source`: only
    those whose `ce_source` it is); the exit code (2: `from_beginning`, or no such exchange). An
    unreachable server raises ServerUnreachableError (exit 3), refused credentials ConfigError."""
    if from_beginning:
        emit(FROM_BEGINNING, sys.stderr)
        return 2
    reader = _Reader(settings, routing_key, decoder, out, source)
    try:
        return asyncio.run(reader.run(max_messages))
    except KeyboardInterrupt:
        return 0


class _Reader:
    def __init__(
        self, settings: Settings, routing_key: str, decoder: MessageDecoder, out: TextIO, source: str | None
    ) -> None:
        self._config = settings.parts().rabbitmq
        self._key, self._decoder, self._out, self._source = routing_key, decoder, out, source

    async def run(self, max_messages: int | None) -> int:
        from pika.exceptions import ChannelClosed

        from relay.rabbitmq.client import channel, close, connect, rpc
        from relay.rabbitmq.errors import NOT_FOUND

        exchange = self._config.exchange
        lost: list[BaseException] = []
        deliveries: asyncio.Queue[Delivery | None] = asyncio.Queue()

        def gone(reason: BaseException) -> None:
            lost.append(reason)
            deliveries.put_nowait(None)

        connection = await connect(self._config, on_closed=gone)
        try:
            ch = await channel(connection)
            try:
                await rpc(ch, ch.exchange_declare, exchange=exchange, passive=True)
            except ChannelClosed as exc:
                if exc.reply_code != NOT_FOUND:
                    raise
                emit(f"outbox-relay tail: no exchange {exchange!r} at {self._config.url}", sys.stderr)
                return 2
            declared = await rpc(ch, ch.queue_declare, queue="", exclusive=True, auto_delete=True)
            queue = declared.method.queue
            await rpc(ch, ch.queue_bind, queue=queue, exchange=exchange, routing_key=self._key)
            await rpc(ch, ch.basic_consume, queue=queue, auto_ack=True,
                      on_message_callback=lambda _ch, m, p, b: deliveries.put_nowait((m, p, b)))  # fmt: skip
            emit(f"outbox-relay tail: messages published to exchange {exchange} matching {self._key} from now on "
                 "(Ctrl-C to stop)", sys.stderr)  # fmt: skip
            await self._print(deliveries, max_messages)
            if lost:
                raise ServerUnreachableError(f"lost the connection to RabbitMQ at {self._config.url}: {lost[0]}")
            return 0
        finally:
            close(connection)

    async def _print(self, deliveries: asyncio.Queue[Delivery | None], max_messages: int | None) -> None:
        printed = 0
        while max_messages is None or printed < max_messages:
            try:
                delivery = await asyncio.wait_for(deliveries.get(), _IDLE_S)
            except TimeoutError:
                continue
            if delivery is None:
                return  # the connection closed
            method, properties, body = delivery
            headers = {str(k): _text(v) for k, v in (properties.headers or {}).items()}
            if self._source is not None and headers.get("ce_source") != self._source:
                continue
            emit(json.dumps(self._line(method, properties, body, headers), ensure_ascii=False), self._out)
            printed += 1

    def _line(self, method: Any, properties: Any, body: bytes, headers: dict[str, Any]) -> dict[str, Any]:
        stamp = properties.timestamp
        line: dict[str, Any] = {
            "exchange": method.exchange,
            "routingKey": method.routing_key,
            "messageId": properties.message_id,
            "timestamp": to_json(dt.datetime.fromtimestamp(stamp, dt.UTC)) if stamp else None,
            "key": headers.get(HEADER_AGGREGATE_ID),
            "headers": headers,
        }
        return decoded_into(line, body, method.routing_key, self._decoder)


def _text(value: Any) -> Any:
    """A header value as JSON holds it: text as it is, bytes as UTF-8 (escaped where not)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
