"""A downstream service consuming through the inbox, as a process the kill test SIGKILLs.

Usage: python -m tests.inbox_service MONGODB_URI DATABASE TOPIC GROUP BOOTSTRAP

With INBOX_TEST_COMMIT_DELAY_S set, every Kafka offset commit waits that long first: the window
between a batch's MongoDB commit and its offset commit, the one the inbox exists for, is then wide
enough for the kill test to aim a SIGKILL into it.
"""

from __future__ import annotations

import os
import sys
import time

import pymongo

from relay.inbox import Inbox
from relay.inbox import inbox as inbox_module
from relay.inbox.consumer import KafkaSource
from relay.ops.logs import setup_logging
from tests.inbox_support import INBOX, effects_handler


class SlowCommitSource(KafkaSource):
    """The inbox's consumer, each offset commit delayed (the MongoDB transaction already committed)."""

    def commit(self, offsets: dict[tuple[str, int], int]) -> bool:
        if offsets:
            time.sleep(float(os.environ["INBOX_TEST_COMMIT_DELAY_S"]))
        return super().commit(offsets)


def main(uri: str, database: str, topic: str, group: str, bootstrap: str) -> None:
    setup_logging("INFO", "json")
    if os.environ.get("INBOX_TEST_COMMIT_DELAY_S"):
        inbox_module.KafkaSource = SlowCommitSource  # type: ignore[misc]
    db = pymongo.MongoClient(uri, tz_aware=True)[database]
    # Small batches: more MongoDB commits followed by Kafka commits for a kill to fall between.
    Inbox(db[INBOX]).run(effects_handler(db), topics=[topic], group_id=group, bootstrap_servers=bootstrap,
                         batch_max_events=40, batch_max_ms=50,
                         # Static membership: the restarted process takes its partitions back at
                         # once instead of waiting for the killed member's session to expire.
                         kafka={"group.instance.id": f"{group}-service", "session.timeout.ms": "6000"})


if __name__ == "__main__":
    main(*sys.argv[1:6])
