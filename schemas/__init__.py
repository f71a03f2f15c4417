"""The Avro schemas of every message the relay writes (installed as the `relay_schemas` package)."""
