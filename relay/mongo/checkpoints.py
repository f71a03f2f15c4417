"""The process's checkpoints in one MongoDB write (relay.core.boundaries.CheckpointStore; when
and which is relay.core.coalescer's).

Layout: the checkpoints stay in the lease documents, one per scope, exactly where a relay stored
them before (a relay upgraded in place reads them as they are; `status`, `checkpoint reset` and
clean-up by checkpoint read the same fields). Several checkpoints are written in ONE
multi-document transaction (majority write concern): one MongoDB commit, one oplog entry (an
`applyOps`) that every change stream reads once, instead of one update and one oplog entry per
scope.

Invariants enforced here:
- Each update is conditional on its own scope's owner and fencing token (relay.mongo.lease's
  fenced update); one that matches nothing is that lease lost: it is counted per update and
  refuses that checkpoint only, and the transaction commits the others. A lost lease never blocks
  or aborts another scope's store.
- The transaction commits all the other checkpoints or none (a failure stores none; the coalescer
  keeps them for the next write). Write conflicts with a takeover or a renewal of one of the
  documents are transient: pymongo's `with_transaction` runs it again, and the retry sees the
  new owner (that scope refused, the rest stored).
- One checkpoint is one fenced update, without a transaction (RELAY_CHECKPOINT_INTERVAL_MS=0 with
  one scope writes what the relay always wrote).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import MongoClient
from pymongo.client_session import ClientSession

from relay.core.errors import LeaseLostError
from relay.core.positions import CheckpointWrite
from relay.mongo.lease import MAJORITY, LeaseStore


class MongoCheckpointStore:
    """Writes checkpoints to the lease documents of `leases` (by lease id), several in one transaction."""

    def __init__(self, client: MongoClient[Any], leases: Mapping[str, LeaseStore]) -> None:
        self._client = client
        self._leases = dict(leases)

    def store(self, checkpoints: Sequence[CheckpointWrite]) -> set[str]:
        """Store `checkpoints` fenced, in one transaction when there are several; the lease ids refused."""
        if len(checkpoints) == 1:
            return self._each(checkpoints, None)
        with self._client.start_session() as session:
            refused: set[str] = session.with_transaction(lambda s: self._each(checkpoints, s), write_concern=MAJORITY)
        return refused

    def _each(self, checkpoints: Sequence[CheckpointWrite], session: ClientSession | None) -> set[str]:
        refused = set()
        for p in checkpoints:
            try:
                self._leases[p.lease_id].store_checkpoint(p.grant, p.token, p.fingerprint, session)
            except LeaseLostError:
                refused.add(p.lease_id)  # that update matched nothing; the transaction goes on
        return refused
