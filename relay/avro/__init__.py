"""Messages: the schema folder and its contract, the BSON -> Avro mapping, the framings
(single-object, Confluent), the message builder, dead letters, and `schemas check`."""
