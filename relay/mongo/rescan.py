"""Recovery from history loss by re-scanning the outbox (RELAY_ON_HISTORY_LOST=rescan).

When the stored token has fallen off the oplog, the changes between it and the oldest oplog
entry cannot be read any more. With the rescan policy the change source
(`relay.mongo.subscription.Subscription.rescan`) takes the stream's position "now" first, then serves
every outbox document still in the collection, then the stream's opening token, which the loop
stores once everything before it is acknowledged. Consequences, documented in the README runbook:
- events published before the loss are published again (duplicates, same event ids);
- events inserted while the scan runs arrive twice (from the scan and from the stream);
- events already deleted from the outbox (e.g. by a TTL index) cannot be recovered;
- the commit order of scanned events is unknown: they are published by (occurredAt, _id), and
  their `source.position` is synthetic, "00" + scan time + index, so it sorts before every real
  change stream position (real tokens start with "82") and a scanned event never wins over a
  live one in "latest position wins" views.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from pymongo.collection import Collection

from relay.core.change import Change
from relay.core.message import event_id_of
from relay.mongo.codecs import RAW_CHANGE_CODEC


def rescan_changes(
    outbox: Collection[Any], occurred_at_field: str, document_filter: Mapping[str, Any] | None = None
) -> Iterator[Change]:
    """Every outbox document (matching `document_filter`: one partition's) as a Change with a
    synthetic position, no cluster time and no wall time, in (occurredAt, _id) order."""
    scan = f"00{int(time.time()):08x}"
    cursor = outbox.with_options(codec_options=RAW_CHANGE_CODEC).find(
        dict(document_filter or {}), sort=[(occurred_at_field, 1), ("_id", 1)]
    )
    for index, doc in enumerate(cursor):
        yield Change(event_id_of(doc), {"_data": f"{scan}{index:012x}"}, None, -1, bytes(doc.raw))
