"""Connections to NATS: how the relay connects (credentials, TLS, no automatic reconnect) and the
wait for the servers at start.

A connection carries one leading session's publishes (relay.nats.publisher) or one command's
requests; it never reconnects on its own (`allow_reconnect=False`): a lost connection ends the
session that used it, which publishes again from its stored checkpoint on a fresh one, the way a
Kafka session drops its producer. nats-py's own error callback would print every failed attempt;
here each goes to the DEBUG log and the relay's error names the cause once.
"""

from __future__ import annotations

import logging
import ssl
import time
from typing import Any

import nats
from nats.aio.client import Client
from tenacity import wait_fixed

from relay.core.errors import ConfigError, ServerUnreachableError
from relay.core.names import env_name
from relay.core.retry import FIRST_WAIT_S, retrying_async, waiting_line
from relay.nats.config import NatsConfig
from relay.nats.errors import auth_refused

log = logging.getLogger(__name__)

CLIENT_NAME = "outbox-relay"
_ATTEMPT_TIMEOUT_S = 2.0  # one connection attempt to one server (TCP, TLS, CONNECT)
_RETRY_WAIT_S = 0.5


async def _debug(exc: Exception) -> None:
    log.debug("nats client: %s: %s", type(exc).__name__, exc)


def options(config: NatsConfig) -> dict[str, Any]:
    """nats-py's `connect` options for `config`: its servers, credentials and TLS, one attempt per
    server, no automatic reconnect."""
    opts: dict[str, Any] = {
        "servers": config.server_urls,
        "name": CLIENT_NAME,
        "allow_reconnect": False,
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0.1,
        "connect_timeout": min(_ATTEMPT_TIMEOUT_S, config.connect_timeout_s),
        "error_cb": _debug,
    }
    if config.creds_file:
        opts["user_credentials"] = config.creds_file
    if config.user:
        opts["user"], opts["password"] = config.user, config.password.reveal()
    if config.token.reveal():
        opts["token"] = config.token.reveal()
    if config.tls_ca or any(url.startswith("tls://") for url in config.server_urls):
        opts["tls"] = ssl.create_default_context(cafile=config.tls_ca or None)
    return opts


async def connect(config: NatsConfig, timeout_s: float | None = None, **extra: Any) -> Client:
    """A connection to one of the servers, tried again until `timeout_s` (default
    RELAY_CONNECT_TIMEOUT_S, and the start-up's WARNING line once none answered for a second:
    relay.core.retry.waiting_line) while none answers: ServerUnreachableError then; ConfigError
    naming the credentials' setting when a server refuses them (at once)."""
    limit = config.connect_timeout_s if timeout_s is None else timeout_s
    started, said = time.monotonic(), [False]
    say = waiting_line("NATS", config.servers, "nats_servers", limit)

    async def attempt() -> Client:
        return await nats.connect(**options(config), **extra)

    def before_wait(_error: BaseException, _seconds: float) -> None:
        elapsed = time.monotonic() - started
        if timeout_s is None and not said[0] and elapsed >= FIRST_WAIT_S:
            said[0] = True
            say(limit - elapsed)

    try:
        return await retrying_async(
            lambda exc: auth_refused(exc) is None,
            give_up_after_s=limit,
            wait=wait_fixed(_RETRY_WAIT_S),
            before_wait=before_wait,
        )(attempt)
    except Exception as exc:  # every failure to connect becomes one relay error
        refused = auth_refused(exc)
        if refused is not None:
            raise ConfigError(_credentials_setting(config), f"NATS at {config.servers} {refused}") from exc
        raise ServerUnreachableError(
            f"cannot reach NATS at {config.servers} within {limit:g}s ({env_name('nats_servers')}): "
            f"{type(exc).__name__}{': ' + str(exc) if str(exc) else ''}"
        ) from exc


def _credentials_setting(config: NatsConfig) -> str:
    """The setting to look at when the server refuses the credentials."""
    if config.creds_file:
        return env_name("nats_creds")
    if config.user:
        return env_name("nats_password")
    if config.token.reveal():
        return env_name("nats_token")
    return env_name("nats_servers")
