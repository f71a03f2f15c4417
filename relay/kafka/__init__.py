"""The Kafka side: the idempotent and the transactional producer (one shared produce loop), the
two delivery modes, the offsets topic, reachability, and confluent-kafka's errors in the relay's
terms."""
