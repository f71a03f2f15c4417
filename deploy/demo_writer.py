"""The demo order service alone: writes orders and their outbox events, in transactions.

For docker-compose (service `demo`): the relay runs in its own container, so this writes and
does nothing else. It reads the relay's settings (`RELAY_MONGODB_URI`, `RELAY_DATABASE`,
`RELAY_OUTBOX_COLLECTION`, `RELAY_FIELD_*`) from the environment, creates the outbox collection
and its index if needed, then writes `--rate` events per second until SIGTERM/SIGINT, or until
`--events` events were written.

    python deploy/demo_writer.py [--rate 20] [--events N]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from relay.config import Settings
from relay.dev.demo import DemoService
from relay.core.errors import EXIT_UNREACHABLE, RelayError
from relay.outbox import FieldNames, Outbox


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0, help="events per second (default 20)")
    parser.add_argument("--events", type=int, default=None, help="stop after this many events")
    args = parser.parse_args(argv)
    try:
        settings = Settings.load()
    except RelayError as exc:
        print(f"demo-writer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fields = settings.parts().encoding.fields
    timeout_ms = int(settings.connect_timeout_s * 1000)
    try:
        client: MongoClient[Any] = MongoClient(settings.mongodb_uri, serverSelectionTimeoutMS=timeout_ms)
        with client:
            db = client[settings.database]
            for line in Outbox(db[settings.outbox_collection], fields).init():
                print(f"demo-writer: {line}", flush=True)
            service = DemoService(db, settings.outbox_collection, fields)
            written_to = f"{settings.database}.{settings.outbox_collection}"
            reporter = threading.Thread(target=_report, args=(service, written_to, stop), daemon=True)
            reporter.start()
            service.run(stop, args.rate, args.events)
            stop.set()
            reporter.join()
    except PyMongoError as exc:
        print(f"demo-writer: MongoDB at {settings.mongodb_uri}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return 0


def _report(service: DemoService, namespace: str, stop: threading.Event) -> None:
    """A progress line every few seconds, and a last one when stopping."""
    reported = -1
    while True:
        stopping = stop.wait(5.0)
        if service.written != reported:
            reported = service.written
            print(f"demo-writer: {reported} events written to {namespace}", flush=True)
        if stopping:
            return


if __name__ == "__main__":
    sys.exit(main())
