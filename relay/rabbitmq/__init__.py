"""RabbitMQ as the relay's broker (RELAY_BROKER=rabbitmq; docs/rabbitmq.md): pika on its asyncio
adapter, on an event loop of its own (relay.loop_thread), behind the loop's boundaries
(relay.core.boundaries.DeliveryMode and Publisher). Imports nothing of relay.kafka or relay.nats."""
