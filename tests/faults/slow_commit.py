"""`python -m tests.faults.slow_commit run`: the relay, with a pause inside every Kafka transaction.

Test-only. In exactly-once mode a transaction spans several reads. Here, before each commit, the
transaction's messages are flushed to the log (a read_uncommitted consumer sees them), a line
`slow_commit: transaction open` goes to stderr, and the commit waits RELAY_TEST_COMMIT_DELAY_S
seconds (default 0.3), so a kill, a pause or a broker failure aimed at "inside a transaction"
lands there instead of in the few milliseconds a commit takes. With RELAY_TEST_COMMIT_FLUSH=0 the
messages are not flushed first: with a long `linger.ms` they are still in the producer's queue
during the pause, so a broker failure then makes them time out and the transaction abort.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from relay.cli import main
from relay.kafka import transactions

DELAY_S = float(os.environ.get("RELAY_TEST_COMMIT_DELAY_S", "0.3"))
FLUSH = os.environ.get("RELAY_TEST_COMMIT_FLUSH", "1") == "1"
MARKER = "slow_commit: transaction open"
_commit = transactions.TransactionalPublisher._commit


def _slow_commit(self: transactions.TransactionalPublisher, while_waiting: Callable[[], None]) -> None:
    if FLUSH:
        self._producer.flush(30)
    print(MARKER, file=sys.stderr, flush=True)
    time.sleep(DELAY_S)  # ...and stay uncommitted for a while
    _commit(self, while_waiting)


if __name__ == "__main__":
    transactions.TransactionalPublisher._commit = _slow_commit  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
