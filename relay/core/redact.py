"""Redaction: what the relay shows of credentials (nothing).

One place decides how settings and server addresses are rendered, and every output goes through
it: error messages that name a server, the settings' own `repr`, the log formatters, and the
one-line message a command prints when it stops.

- A URI's user info is shown as `user:***@`; an option of its query string whose name is
  password-like (`tlsCertificateKeyFilePassword`, `authMechanismProperties`) as `***`
  (`redact_uri`, applied to any text by `redact_text`).
- A setting or Kafka client property whose name is password-like is shown as `***`
  (`secret_name`): `*password*`, `*secret*`, `*token*` (but not the fencing or resume token,
  which are positions, not credentials), basic auth, `sasl.*` (but the mechanism), private keys
  (`ssl.key.pem`, `ssl.keystore.key`).
- Last line of defence: the values of the loaded settings' credentials are registered once
  (`register_secrets`, called by `Settings.load`), and `scrub` masks them wherever they appear
  (a driver's message that quotes a password, a traceback); the log formatters and the
  command line pass everything they print through it.

Pure: imports nothing of the relay or of any driver.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

__all__ = [
    "MASK",
    "redact_mapping",
    "redact_text",
    "redact_uri",
    "register_secrets",
    "registered_secrets",
    "scrub",
    "secret_name",
    "uri_secrets",
]

MASK = "***"

# scheme://user[:password]@ : the password (when any) is masked, the user name kept.
_USER_INFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s,\"'?#]+)(?::[^@/\s\"']*)?@")
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
    text = _USER_INFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _QUERY_OPTION.sub(lambda m: f"{m['key']}{MASK}" if secret_name(m["name"]) else m[0], text)


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
    """The credentials a URI carries: its password (as written and decoded) and the values of
    its password-like options."""
    found: list[str] = []
    for m in re.finditer(r"://[^:@/\s]+:([^@/\s]*)@", uri):
        found += [m[1], unquote(m[1])]
    for m in _QUERY_OPTION.finditer(uri):
        if secret_name(m["name"]):
            found += [m["value"], unquote(m["value"])]
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


def registered_secrets() -> frozenset[str]:
    return _secrets


def scrub(text: str) -> str:
    """`text` with URIs redacted and every registered credential value masked (longest first,
    so a value containing another is masked whole)."""
    text = redact_text(text)
    for value in sorted(_secrets, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text
