"""What the NATS side takes from the settings (RELAY_NATS_*), checked where it is used: each
failure names its setting."""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass

from relay.core.config import AT_LEAST_ONCE, EXACTLY_ONCE, positive
from relay.core.errors import ConfigError
from relay.core.names import env_name
from relay.core.redact import Secret, Uri, hold_masked

SCHEMES = ("nats", "tls")
# JetStream's rule for a stream name: no whitespace, no `.`, `*`, `>`, path separators.
_STREAM_NAME = re.compile(r"^[^\s.*>/\\]{1,255}$")


@dataclass(frozen=True, kw_only=True)
class NatsConfig:
    """The JetStream side of the relay (relay.nats): servers, credentials, the stream and how
    long a publish may wait for its acknowledgement.

    Invariants checked here: every server is a `nats://` or `tls://` URL; at most one kind of
    credentials (a .creds file, a user and password, or a token), and files named exist; the
    stream name is one JetStream accepts; every period is positive.
    """

    servers: Uri  # comma-separated URLs, possibly with user:password@ (RELAY_NATS_SERVERS)
    stream: str
    creds_file: str
    user: str
    password: Secret
    token: Secret
    tls_ca: str
    create_stream: bool
    ack_timeout_ms: int
    duplicate_window_s: float
    connect_timeout_s: float
    delivery: str

    def __post_init__(self) -> None:
        hold_masked(self, uris=("servers",), secrets=("password", "token"))
        for url in self.server_urls:
            scheme = urllib.parse.urlsplit(url).scheme
            if scheme not in SCHEMES or not urllib.parse.urlsplit(url).hostname:
                raise ConfigError(env_name("nats_servers"), f"{Uri(url)} is not a nats:// or tls:// URL with a host")
        if not _STREAM_NAME.match(self.stream):
            raise ConfigError(
                env_name("nats_stream"), f"{self.stream!r} is not a JetStream stream name (no spaces, '.', '*', '>')"
            )
        kinds = [k for k, given in (("nats_creds", self.creds_file), ("nats_user", self.user),
                                    ("nats_token", self.token.reveal())) if given]  # fmt: skip
        if len(kinds) > 1:
            raise ConfigError(
                env_name(kinds[1]), f"give one kind of credentials, not both {' and '.join(map(env_name, kinds))}"
            )
        if self.password.reveal() and not self.user:
            raise ConfigError(env_name("nats_password"), "needs RELAY_NATS_USER")
        for name, path in (("nats_creds", self.creds_file), ("nats_tls_ca", self.tls_ca)):
            if path and not os.path.isfile(path):
                raise ConfigError(env_name(name), f"no such file: {path}")
        positive(self.ack_timeout_ms, env_name("nats_ack_timeout_ms"))
        positive(self.duplicate_window_s, env_name("nats_duplicate_window_s"))
        if self.delivery not in (AT_LEAST_ONCE, EXACTLY_ONCE):
            raise ConfigError(env_name("delivery"), f"must be {AT_LEAST_ONCE} or {EXACTLY_ONCE}, got {self.delivery!r}")

    @property
    def server_urls(self) -> list[str]:
        """The servers' URLs, in the clear (only for the client)."""
        return [u.strip() for u in self.servers.reveal().split(",") if u.strip()]

    @property
    def exactly_once(self) -> bool:
        return self.delivery == EXACTLY_ONCE

    @property
    def ack_timeout_s(self) -> float:
        return self.ack_timeout_ms / 1000
