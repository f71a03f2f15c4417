"""How a Kafka value names its writer schema: the framing's fixed bytes and names.

Kept free of imports so that readers (the Spark jobs' executors among them) can use the
constants without loading the codecs.
"""

from __future__ import annotations

# Avro single-object encoding: C3 01, the writer schema's 8-byte little-endian CRC-64-AVRO
# fingerprint, the Avro binary body.
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
# The Confluent wire format: byte 0, the 4-byte big-endian schema id, the Avro binary body.
CONFLUENT_MAGIC = 0
SINGLE_OBJECT = "single-object"
CONFLUENT = "confluent"
