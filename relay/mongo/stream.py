"""The shared change stream's import path: the reader is relay.mongo.shared_reader, a member's
mailbox relay.mongo.mailbox, a leading session's change source relay.mongo.subscription."""

from __future__ import annotations

from relay.mongo.mailbox import Mailbox
from relay.mongo.shared_reader import SharedStream
from relay.mongo.subscription import Subscription, subscriptions

__all__ = ["Mailbox", "SharedStream", "Subscription", "subscriptions"]
