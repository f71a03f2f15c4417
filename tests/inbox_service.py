"""A downstream service consuming through the inbox, as a process the kill test SIGKILLs.

Usage: python -m tests.inbox_service MONGODB_URI DATABASE TOPIC GROUP BOOTSTRAP
"""

from __future__ import annotations

import sys

import pymongo

from relay.inbox import Inbox
from relay.ops.logs import setup_logging
from tests.inbox_support import INBOX, effects_handler


def main(uri: str, database: str, topic: str, group: str, bootstrap: str) -> None:
    setup_logging("INFO", "json")
    db = pymongo.MongoClient(uri, tz_aware=True)[database]
    # Small batches: more MongoDB commits followed by Kafka commits for a kill to fall between.
    Inbox(db[INBOX]).run(effects_handler(db), topics=[topic], group_id=group, bootstrap_servers=bootstrap,
                         batch_max_events=40, batch_max_ms=50,
                         # Static membership: the restarted process takes its partitions back at
                         # once instead of waiting for the killed member's session to expire.
                         kafka={"group.instance.id": f"{group}-service", "session.timeout.ms": "6000"})


if __name__ == "__main__":
    main(*sys.argv[1:6])
