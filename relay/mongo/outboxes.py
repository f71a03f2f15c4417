"""Outboxes added to RELAY_OUTBOXES (docs/outboxes.md, "Adding and removing an outbox").

An outbox is *added* when none of its lease documents exists yet while another outbox of the
deployment has a stored checkpoint: the deployment ran before without it. Its new lease documents
are created marked `rescan` (relay.mongo.lease): each of its scopes starts by publishing every
document the outbox already holds, then its events from that moment on (relay.core.resume), so
the documents written while it was not listed are published once, whatever the oplog still holds.
A first deployment (no checkpoint anywhere) starts at RELAY_START_AT as a single outbox does. A
removed outbox's lease documents stay (`status` shows them); listed again later, it resumes from
its own checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo.collection import Collection

from relay.core.namespace import Namespace
from relay.core.partitions import lease_id_pattern


def added(leases: Collection[Any], outboxes: Sequence[Namespace]) -> set[Namespace]:
    """The outboxes of `outboxes` added since the deployment last ran (the module docstring)."""
    seen: set[Namespace] = set()
    checkpointed = False
    for namespace in outboxes:
        docs = list(leases.find({"_id": {"$regex": lease_id_pattern(namespace)}}, projection={"resumeToken": 1}))
        if docs:
            seen.add(namespace)
            checkpointed = checkpointed or any(d.get("resumeToken") is not None for d in docs)
    return {n for n in outboxes if n not in seen} if checkpointed else set()
