"""Connections to RabbitMQ on the relay's event loop thread (pika's asyncio adapter): how the relay
connects (the URL, TLS, one attempt at a time, tried again until the connect timeout), opens a
channel, and makes sure of the exchange.

A connection carries one leading session's publishes (relay.rabbitmq.publisher) or one start-up
check; it never reconnects on its own (pika's asynchronous adapters do not): a lost connection ends
the session that used it, which publishes again from its stored checkpoint on a fresh one, the way a
Kafka session drops its producer. Every function here runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.channel import Channel
from pika.exceptions import ChannelClosed
from tenacity import wait_fixed

from relay.core.errors import ConfigError, ServerUnreachableError
from relay.core.names import env_name
from relay.core.retry import retrying_async
from relay.rabbitmq.config import RabbitConfig
from relay.rabbitmq.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, auth_refused, describe

log = logging.getLogger("relay")

CLIENT_NAME = "outbox-relay"
EXCHANGE_TYPE = "topic"
_ATTEMPT_TIMEOUT_S = 5.0  # one connection attempt (TCP, TLS, the AMQP handshake)
_RETRY_WAIT_S = 0.5
_RPC_TIMEOUT_S = 10.0  # opening a channel, a declare

OnClosed = Callable[[BaseException], None]


def parameters(config: RabbitConfig) -> pika.URLParameters:
    """pika's connection parameters for `config`: the URL's (host, port, virtual host, credentials,
    its query options), one attempt, the relay's name, TLS with RELAY_RABBITMQ_TLS_CA for amqps."""
    try:
        params = pika.URLParameters(config.url.reveal())
    except ValueError as exc:  # an unknown or malformed query option
        raise ConfigError(env_name("rabbitmq_url"), f"{config.url}: {exc}") from exc
    params.client_properties = {"connection_name": CLIENT_NAME, "product": CLIENT_NAME}
    params.connection_attempts = 1
    params.socket_timeout = min(_ATTEMPT_TIMEOUT_S, config.connect_timeout_s)
    params.stack_timeout = min(_ATTEMPT_TIMEOUT_S, config.connect_timeout_s)
    if config.tls:
        context = ssl.create_default_context(cafile=config.tls_ca or None)
        params.ssl_options = pika.SSLOptions(context, server_hostname=params.host)
    return params


async def connect(
    config: RabbitConfig, timeout_s: float | None = None, on_closed: OnClosed | None = None
) -> AsyncioConnection:
    """A connection, tried again until `timeout_s` (default RELAY_CONNECT_TIMEOUT_S) while the server
    does not answer: ServerUnreachableError then; ConfigError naming RELAY_RABBITMQ_URL at once when
    it refuses the credentials or the virtual host. `on_closed(reason)` is called if the open
    connection closes later (the server went away, or `close()`)."""
    limit = config.connect_timeout_s if timeout_s is None else timeout_s
    params = parameters(config)

    async def attempt() -> AsyncioConnection:
        return await _open(params, on_closed)

    try:
        return await retrying_async(
            lambda exc: auth_refused(exc) is None, give_up_after_s=limit, wait=wait_fixed(_RETRY_WAIT_S)
        )(attempt)
    except Exception as exc:  # every failure to connect becomes one relay error
        refused = auth_refused(exc)
        if refused is not None:
            raise ConfigError(env_name("rabbitmq_url"), f"RabbitMQ at {config.url} {refused}") from exc
        raise ServerUnreachableError(
            f"cannot reach RabbitMQ at {config.url} within {limit:g}s ({env_name('rabbitmq_url')}): {describe(exc)}"
        ) from exc


async def _open(params: pika.URLParameters, on_closed: OnClosed | None) -> AsyncioConnection:
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[AsyncioConnection] = loop.create_future()

    def failed(_connection: Any, exc: BaseException | str) -> None:
        error = exc if isinstance(exc, BaseException) else ConnectionError(str(exc))
        if not opened.done():
            opened.set_exception(error)
        elif on_closed is not None:
            on_closed(error)

    connection = AsyncioConnection(
        params,
        on_open_callback=lambda c: _resolve(opened, c),
        on_open_error_callback=failed,
        on_close_callback=failed,
        custom_ioloop=loop,
    )
    try:
        return await asyncio.wait_for(opened, _ATTEMPT_TIMEOUT_S * 2)
    except BaseException:
        close(connection)
        raise


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def close(connection: AsyncioConnection) -> None:
    """Start closing `connection` unless it is closing or closed already."""
    if not (connection.is_closing or connection.is_closed):
        connection.close()


async def channel(
    connection: AsyncioConnection, on_closed: Callable[[Channel, BaseException], None] | None = None
) -> Channel:
    """A fresh channel on `connection` (`on_closed(channel, reason)` once it closes)."""
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[Channel] = loop.create_future()
    connection.channel(on_open_callback=lambda ch: _resolve(opened, ch))
    ch = await asyncio.wait_for(opened, _RPC_TIMEOUT_S)
    if on_closed is not None:
        ch.add_on_close_callback(on_closed)
    return ch


async def rpc(ch: Channel, method: Callable[..., None], **arguments: Any) -> Any:
    """`method(**arguments, callback=...)` on channel `ch`, awaited: its reply frame, or the
    ChannelClosed that closing the channel answered it with."""
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def closed(_ch: Channel, reason: BaseException) -> None:
        if not answer.done():
            answer.set_exception(reason)

    ch.add_on_close_callback(closed)
    method(**arguments, callback=lambda frame: _resolve(answer, frame))
    return await asyncio.wait_for(answer, _RPC_TIMEOUT_S)


async def ensure_exchange(connection: AsyncioConnection, exchange: str) -> None:
    """The exchange exists as a durable topic exchange, declared when missing: ConfigError naming
    RELAY_RABBITMQ_EXCHANGE when one of another kind holds the name, or when it is missing and the
    user may not declare it. A user without configure permission can still publish to an exchange
    the operator declared: a passive declare needs no permission (it cannot tell the kind, though)."""
    setting = env_name("rabbitmq_exchange")
    ch = await channel(connection)
    try:
        await rpc(ch, ch.exchange_declare, exchange=exchange, passive=True)
        existed = True
    except ChannelClosed as exc:
        if exc.reply_code != NOT_FOUND:
            raise
        existed, ch = False, await channel(connection)  # the refusal closed that channel
    try:
        await rpc(ch, ch.exchange_declare, exchange=exchange, exchange_type=EXCHANGE_TYPE, durable=True)
    except ChannelClosed as exc:
        if exc.reply_code == PRECONDITION_FAILED:
            raise ConfigError(
                setting, f"RabbitMQ holds an exchange {exchange} that is not a durable topic exchange: {exc.reply_text}"
            ) from exc
        if exc.reply_code != ACCESS_REFUSED:
            raise
        if existed:
            return
        raise ConfigError(
            setting,
            f"RabbitMQ has no exchange {exchange} and refused to let the relay's user declare it ({exc.reply_text}): "
            "declare it (a durable topic exchange) or grant the user configure permission on it",
        ) from exc
    if not existed:
        log.info("declared RabbitMQ exchange %s (durable, topic)", exchange)
