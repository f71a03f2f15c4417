"""The suite's two tiers (docs/testing.md, "Two tiers").

`make test` runs every test, each soak-sized scenario (marked `soak`) at the smallest size that
still proves its property: its faults still land while a backlog is being written and published.
`make soak` runs only the `soak` scenarios, at full size: it sets RELAY_SOAK=1, and `size` then
answers the full figure.

A scenario keeps its faults and its writers' duration in both tiers; what shrinks is the number of
events (the writers pause longer between transactions), which is where the CPU goes.
"""

from __future__ import annotations

import os
from typing import TypeVar

N = TypeVar("N", int, float)

#: True under `make soak` (RELAY_SOAK=1): soak-sized scenarios run at full size.
FULL = os.environ.get("RELAY_SOAK") == "1"


def size(suite: N, soak: N) -> N:
    """`soak` under `make soak`, `suite` under `make test`."""
    return soak if FULL else suite
