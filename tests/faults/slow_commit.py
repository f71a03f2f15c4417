"""`python -m tests.faults.slow_commit run`: the relay, with a pause inside every Kafka transaction.

Test-only. In exactly-once mode a transaction spans several reads. Here, before each commit, the
transaction's messages are flushed to the log (a read_uncommitted consumer sees them), a line
`slow_commit: transaction open` goes to stderr, and the commit waits RELAY_TEST_COMMIT_DELAY_S
seconds (default 0.3), so a kill, a pause or a broker failure aimed at "inside a transaction"
lands there instead of in the few milliseconds a commit takes. With RELAY_TEST_COMMIT_FLUSH=0 the
messages are not flushed first: with a long `linger.ms` they are still in the producer's queue
during the pause, so a broker failure then makes them time out and the transaction abort.
The pause runs on the commit thread (relay.kafka.committer.Committer), which holds the producer
from the commit's start to its end; the loop reads and encodes on meanwhile.
"""

from __future__ import annotations

import os
import sys
import time

from relay.cli import main
from relay.kafka.committer import Committer

DELAY_S = float(os.environ.get("RELAY_TEST_COMMIT_DELAY_S", "0.3"))
FLUSH = os.environ.get("RELAY_TEST_COMMIT_FLUSH", "1") == "1"
MARKER = "slow_commit: transaction open"
_run = Committer._run


def _slow_run(self: Committer) -> None:
    if FLUSH:
        self._producer.flush(30)
    print(MARKER, file=sys.stderr, flush=True)
    time.sleep(DELAY_S)  # ...and stay uncommitted for a while
    _run(self)


if __name__ == "__main__":
    Committer._run = _slow_run  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
