"""What the RabbitMQ side takes from the settings (RELAY_RABBITMQ_*), checked where it is used: each
failure names its setting."""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

from relay.core.config import AT_LEAST_ONCE, EXACTLY_ONCE, positive
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.redact import Uri, hold_masked

SCHEMES = ("amqp", "amqps")
# AMQP 0-9-1's exchange names: letters, digits, '-', '_', '.', ':', at most 255 bytes. The empty
# name is the default exchange, which routes by queue name and cannot be declared.
_EXCHANGE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,255}$")
# The one line RELAY_DELIVERY=exactly-once gets on RabbitMQ (docs/rabbitmq.md, "Exactly-once").
NO_EXACTLY_ONCE = (
    "exactly-once is not available with RELAY_BROKER=rabbitmq: RabbitMQ deduplicates only on a stream, "
    "through the stream protocol's named producers, which bypasses the exchange and its bindings "
    "(docs/rabbitmq.md); use at-least-once with consumers that drop duplicates by message_id (relay.inbox), "
    "or RELAY_BROKER=kafka or nats for exactly-once"
)


@dataclass(frozen=True, kw_only=True)
class RabbitConfig:
    """The RabbitMQ side of the relay (relay.rabbitmq): the server's URL, the exchange, and how long
    a publish may wait for its confirm.

    Invariants checked here: the URL is an `amqp://` or `amqps://` URL with a host; the exchange
    name is one AMQP accepts (not the default exchange); the TLS CA named exists; the confirm
    timeout is positive; the delivery mode is one the relay knows. (Exactly-once is refused by the
    broker's start-up check, relay.rabbitmq.broker, only when RELAY_BROKER=rabbitmq.)
    """

    url: Uri  # amqp[s]://user:password@host:port/vhost (RELAY_RABBITMQ_URL)
    exchange: str
    tls_ca: str
    confirm_timeout_ms: int
    connect_timeout_s: float
    delivery: str

    def __post_init__(self) -> None:
        hold_masked(self, uris=("url",))
        parts = urllib.parse.urlsplit(self.url.reveal())
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ConfigError(env_name("rabbitmq_url"), f"{self.url} is not an amqp:// or amqps:// URL with a host")
        if not _EXCHANGE_NAME.match(self.exchange):
            raise ConfigError(
                env_name("rabbitmq_exchange"),
                f"{self.exchange!r} is not an exchange name the relay can publish to (1-255 letters, digits, -_.:)",
            )
        if self.tls_ca and not os.path.isfile(self.tls_ca):
            raise ConfigError(env_name("rabbitmq_tls_ca"), f"no such file: {self.tls_ca}")
        positive(self.confirm_timeout_ms, env_name("rabbitmq_confirm_timeout_ms"))
        if self.delivery not in (AT_LEAST_ONCE, EXACTLY_ONCE):
            raise ConfigError(env_name("delivery"), f"must be {AT_LEAST_ONCE} or {EXACTLY_ONCE}, got {self.delivery!r}")

    @property
    def exactly_once(self) -> bool:
        return self.delivery == EXACTLY_ONCE

    @property
    def confirm_timeout_s(self) -> float:
        return self.confirm_timeout_ms / 1000

    @property
    def tls(self) -> bool:
        return urllib.parse.urlsplit(self.url.reveal()).scheme == "amqps"
