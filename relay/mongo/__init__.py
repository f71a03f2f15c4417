"""The MongoDB side: the client, the change stream (through the documented commands), the lease
and fenced checkpoint, the group's heartbeats, repartitioning, and pymongo's errors in the
relay's terms."""
