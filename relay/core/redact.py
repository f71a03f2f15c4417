"""Redaction: what the relay shows of credentials (nothing).

One place decides how settings and server addresses are rendered:

- A configuration object holds each credential-bearing value as a value type whose `str()`,
  `repr()` and `format()` are the redacted form (`hold_masked`): `Uri` for a server address
  (a MongoDB URI, Kafka bootstrap servers, Schema Registry URLs: its user info shown as
  `user:***@`, its password-like options as `***`), `Secret` for a credential (`***`),
  `Properties` for client properties of which some are credentials (those `***`). A message that
  formats one cannot leak it; `reveal()` (or `dict(properties)`) gives the clear value, and only
  the calls that hand it to a driver use it.
- A setting or Kafka client property whose name is password-like is shown as `***`
  (`secret_name`): `*password*`, `*secret*`, `*token*` (but not the fencing or resume token,
  which are positions, not credentials), basic auth, `sasl.*` (but the mechanism), private keys
  (`ssl.key.pem`, `ssl.keystore.key`).
- What a command prints on stdout goes through `emit` (the same rendering as the log lines).
- Last line of defence: the values of the loaded settings' credentials are registered once
  (`register_secrets`, called by `Settings.load` and the pipeline jobs' option parsing), and
  `scrub` masks them wherever they appear (a driver's message that quotes a password, a
  traceback); the log formatters, `emit` and the command line's error line pass everything
  they print through it.

Pure: imports nothing of the relay or of any driver.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any
from urllib.parse import unquote, urlsplit

__all__ = [
    "MASK",
    "Properties",
    "Secret",
    "Uri",
    "credential_values",
    "emit",
    "hold_masked",
    "redact_mapping",
    "redact_text",
    "redact_uri",
    "register_secrets",
    "scrub",
    "secret_name",
    "uri_secrets",
]

MASK = "***"

# scheme://user[:password]@ : the password (when any) is masked, the user name kept. The user info
# runs to the last `@` before the host part ends (`/`, `?`, `#`, a space or a quote), as pymongo
# and urllib split it, so an unescaped `@` in a password does not leave its tail shown.
_USER_INFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^/?#\s\"']*)@")
_QUERY_OPTION = re.compile(r"(?P<key>[?&;](?P<name>[A-Za-z_.]+)=)(?P<value>[^&;\s\"']*)")
_NOT_SECRET = re.compile(r"^token$|fencing|resume|^sasl\.mechanisms?$|^sasl_mechanisms?$|token_prefix|tokencluster")
_SECRET = re.compile(
    r"password|passwd|secret|token|basic[._]?auth|credential|^sasl[._]|jaas|mechanismproperties|"
    r"^ssl[._]key[._]pem$|^ssl[._]keystore[._]key$|private[._]?key"
)
# A registered value this short would mask innocent text everywhere; credentials are longer.
_MIN_SECRET_CHARS = 4

_lock = threading.Lock()
_secrets: frozenset[str] = frozenset()


def secret_name(name: str) -> bool:
    """Whether a setting, Kafka property or URI option called `name` holds a credential."""
    low = name.lower()
    return bool(_SECRET.search(low)) and not _NOT_SECRET.search(low)


def redact_uri(uri: str) -> str:
    """`uri` with the password of its user info and its password-like options masked."""
    return redact_text(uri)


def redact_text(text: str) -> str:
    """`text` with every URI's password and password-like query option masked."""
    text = _USER_INFO.sub(_masked_user_info, text)
    return _QUERY_OPTION.sub(lambda m: f"{m['key']}{MASK}" if secret_name(m["name"]) else m[0], text)


def _masked_user_info(m: re.Match[str]) -> str:
    user = m["info"].partition(":")[0]
    shown = user if user and "@" not in user else ""  # a user name holding an `@` is malformed: none
    return f"{m['scheme']}{shown}:{MASK}@" if shown else f"{m['scheme']}{MASK}@"


def redact_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of settings or client properties as they may be shown: credentials as `***`,
    every text value's URIs redacted (nested mappings too)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out[key] = redact_mapping(value)
        elif secret_name(str(key)) and value not in ("", None):
            out[key] = MASK
        elif isinstance(value, str):
            out[key] = redact_text(value)
        else:
            out[key] = value
    return out


def uri_secrets(uri: str) -> list[str]:
    """The credentials URLs carry (one, or several comma-separated): each password of a user
    info, as written and decoded (split as `urllib.parse.urlsplit` does: at the last `@`), and the
    values of password-like query options. (MongoDB URIs: relay.mongo.config.uri_credentials.)"""
    found: list[str] = []
    for url in uri.split(","):
        try:
            password = urlsplit(url.strip()).password
        except ValueError:  # a malformed port, say: the user info is still what precedes the last `@`
            password = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0].partition(":")[2] or None
        if password:
            found += [password, unquote(password)]
    for m in _QUERY_OPTION.finditer(uri):
        if secret_name(m["name"]):
            found += [m["value"], unquote(m["value"])]
    return found


# `password="..."` inside a value (a JAAS configuration: sasl.jaas.config=... ScramLoginModule required
# username="relay" password="...";): the quoted credential on its own, as a client may quote it.
_QUOTED_SECRET = re.compile(r'(?i)\b[\w.]*(?:password|secret|token)[\w.]*\s*=\s*"([^"]*)"')


def credential_values(name: str, value: str) -> list[str]:
    """What to register (`register_secrets`) for a setting or client property `name` = `value`:
    the whole value when the name is password-like, with the quoted credentials it holds (a JAAS
    configuration's `password="..."`), and the passwords of any URL in it."""
    found = uri_secrets(value)
    if secret_name(name):
        found += [value, *_QUOTED_SECRET.findall(value)]
    return found


def register_secrets(values: Iterable[str]) -> None:
    """Remember credential values so that `scrub` masks them in everything printed (added to
    those registered before: a process may load settings more than once)."""
    global _secrets
    fresh: set[str] = set()
    for value in values:
        if value and len(value) >= _MIN_SECRET_CHARS:
            fresh |= {value, json.dumps(value)[1:-1]}  # as written, and as a JSON string holds it
    with _lock:
        _secrets = _secrets | fresh


def scrub(text: str) -> str:
    """`text` with URIs redacted and every registered credential value masked (longest first,
    so a value containing another is masked whole)."""
    text = redact_text(text)
    for value in sorted(_secrets, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


def emit(text: str, file: IO[str] | None = None) -> None:
    """Print what a command shows (its JSON, a report, a decoded message) as it may be shown:
    through `scrub`, like every log line."""
    print(scrub(text), file=file or sys.stdout, flush=True)


# ---- values that render masked by construction ---------------------------------------------


class Secret:
    """A credential (a password, `USER:PASSWORD` basic auth): `str()`, `repr()` and any
    formatting show `***` (nothing when empty); `reveal()` gives the clear value, for the driver.
    Equal to a `Secret` of the same value (not to a str: compare `reveal()`)."""

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = value

    @classmethod
    def of(cls, value: Secret | str) -> Secret:
        return value if isinstance(value, Secret) else cls(value)

    def reveal(self) -> str:
        """The clear value: only for the call that hands it to a driver."""
        return self._value

    def __str__(self) -> str:
        return MASK if self._value else ""

    def __repr__(self) -> str:
        return repr(str(self))

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and type(other) is type(self) and other.reveal() == self._value

    def __hash__(self) -> int:
        return hash((type(self), self._value))

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        return type(self), (self._value,)


class Uri(Secret):
    """A server address that may carry credentials (a MongoDB URI, Kafka bootstrap servers,
    Schema Registry URLs): shown with its user info as `user:***@` and its password-like options
    as `***` (`redact_uri`); `reveal()` gives the clear address, for the driver."""

    __slots__ = ()

    @classmethod
    def of(cls, value: Secret | str) -> Uri:
        return value if isinstance(value, Uri) else cls(value.reveal() if isinstance(value, Secret) else value)

    def __str__(self) -> str:
        return redact_uri(self._value)


class Properties(Mapping[str, str]):
    """Client properties (Kafka's) of which some may be credentials: a read-only mapping of the
    clear values, for the driver (`dict(properties)`); `str()` and `repr()` show every
    password-like one as `***` (`redact_mapping`)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return repr(redact_mapping(self._values))

    __str__ = __repr__

    def __reduce__(self) -> tuple[type[Properties], tuple[dict[str, str]]]:
        return type(self), (self._values,)


def hold_masked(
    config: Any, uris: Iterable[str] = (), secrets: Iterable[str] = (), properties: Iterable[str] = ()
) -> None:
    """Make the named fields of the frozen dataclass `config` hold `Uri`, `Secret` and
    `Properties` values (a plain str or mapping given is wrapped): how every configuration
    object keeps its credentials, so its `repr` and every message formatting them show them
    masked. Called from the configuration's `__post_init__`."""
    assert dataclasses.is_dataclass(config)
    for name in uris:
        object.__setattr__(config, name, Uri.of(getattr(config, name)))
    for name in secrets:
        object.__setattr__(config, name, Secret.of(getattr(config, name)))
    for name in properties:
        value = getattr(config, name)
        object.__setattr__(config, name, value if isinstance(value, Properties) else Properties(value))
