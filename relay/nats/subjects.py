"""NATS subjects: which subjects the relay publishes to (from the topic template) and whether a
stream's subject filters cover them.

A subject is tokens separated by `.`; a filter may hold `*` (one token) and a last `>` (one or
more tokens). A topic the template gives is a subject when no token is empty (Kafka's topic rule,
which the encoder checks, allows the characters; NATS adds that rule).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence


def valid_subject(subject: str) -> bool:
    """Whether NATS accepts `subject` to publish to: no empty token, no wildcard, no whitespace."""
    tokens = subject.split(".")
    return all(t and t not in ("*", ">") and not any(c.isspace() for c in t) for t in tokens)


def pattern_of(template: str, tail: str = "*") -> str:
    """The subjects a topic template gives, as a filter: each token holding a placeholder becomes
    `tail` (`*`: the placeholder fills one token, what a stream's filters are checked against;
    `>` for every token from the first placeholder on: what a stream the relay creates takes, so a
    value holding a `.` is stored too)."""
    tokens = []
    for token in template.split("."):
        has_field = any(field is not None for _, field, _, _ in string.Formatter().parse(token))
        if not has_field:
            tokens.append(token.replace("{{", "{").replace("}}", "}"))
        elif tail == ">":
            tokens.append(">")
            break
        else:
            tokens.append("*")
    return ".".join(tokens)


def covers(filter_: str, pattern: str) -> bool:
    """Whether every subject `pattern` matches (a subject, or a filter with `*` and `>`) is matched
    by the stream filter `filter_`."""
    want, have = pattern.split("."), filter_.split(".")
    for i, token in enumerate(have):
        if token == ">":
            return len(want) > i  # one or more tokens left, whatever they are
        if i >= len(want):
            return False
        if want[i] == ">":
            return False  # more tokens than a single filter token
        if token != "*" and token != want[i]:
            return False
    return len(want) == len(have)


def uncovered(filters: Sequence[str], patterns: Iterable[str]) -> list[str]:
    """The patterns no filter of `filters` covers, in order, each once."""
    missing: list[str] = []
    for p in patterns:
        if p not in missing and not any(covers(f, p) for f in filters):
            missing.append(p)
    return missing
