"""The demo's downstream service alone: consumes the orders through the inbox (relay.inbox).

For docker-compose (service `shipping`): reads the relay's settings (`RELAY_MONGODB_URI`,
`RELAY_KAFKA_BOOTSTRAP_SERVERS`, `RELAY_DATABASE`, `RELAY_TOPIC_TEMPLATE`) from the environment
and applies each order event to its shipment document (`shipments` collection) exactly once,
until SIGTERM/SIGINT; then prints the counts (events applied, duplicates skipped).

    python deploy/shipping_service.py
"""

from __future__ import annotations

import sys

from pymongo import MongoClient

from relay.config import Settings
from relay.dev.demo import ShippingService
from relay.ops.logs import setup_logging


def main() -> int:
    settings = Settings.load()
    setup_logging(settings.log_level, settings.log_format)
    topic = settings.topic_template.format(aggregateType="order", eventType="")
    with MongoClient(settings.mongodb_uri, tz_aware=True) as client:
        shipping = ShippingService(client[settings.database], settings, topic)
        shipping.run()  # until SIGTERM/SIGINT
        print(shipping.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
