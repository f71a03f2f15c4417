"""Dev tooling, never imported by the relay or the Spark jobs: the local MongoDB replica set and
Kafka broker, a Schema Registry server, Maven resolution, the demo."""
