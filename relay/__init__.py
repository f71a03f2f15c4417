"""outbox-relay: publishes a MongoDB outbox collection to Kafka, in order, at least once
(or exactly once for read_committed consumers, with RELAY_DELIVERY=exactly-once).

Services write events with `from relay import Outbox, OutboxEvent` (relay.outbox), asyncio
services with `from relay import AsyncOutbox, OutboxEvent`. The names are
loaded on first use, so importing a submodule (the Spark jobs' decoders on an executor, say)
does not load the MongoDB driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.outbox import AsyncOutbox, Outbox, OutboxEvent

__all__ = ["AsyncOutbox", "Outbox", "OutboxEvent"]
__version__ = "0.2.0+dev"


def __getattr__(name: str) -> Any:
    if name in __all__:
        import relay.outbox

        return getattr(relay.outbox, name)
    raise AttributeError(f"module 'relay' has no attribute {name!r}")
