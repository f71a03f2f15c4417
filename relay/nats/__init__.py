"""NATS JetStream as the relay's broker (RELAY_BROKER=nats; docs/nats.md): the nats-py client on an
event loop of its own, behind the loop's boundaries (relay.core.boundaries.DeliveryMode and
Publisher). Imports nothing of relay.kafka, and relay.kafka nothing of it."""
