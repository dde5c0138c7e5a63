"""Kafka records as inorder sees them, and the columns every output row carries.

The source yields Arrow record batches with :data:`KAFKA_ARROW_SCHEMA` (the same columns as
Spark's Kafka connector). Every output row of a pipeline starts with :data:`ORIGIN_FIELDS`
(where the row came from) and ends with ``batch_id`` (which micro-batch wrote it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

from inorder.ddl import arrow_ddl

#: One Kafka record header: ``(key, value)``; the value may be null.
Header = tuple[str, bytes | None]

#: One record of a topic-partition as the engine applies it:
#: ``(offset, kafka_key, value, timestamp_us, headers)``.
RecordTuple = tuple[int, bytes | None, bytes | None, int | None, Any]

#: Schema of the records the Kafka source yields (Spark Kafka connector compatible).
KAFKA_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ),
    ]
)

#: The same schema as a Spark DDL string (for ``DataSource.schema()``).
KAFKA_SPARK_DDL = arrow_ddl(KAFKA_ARROW_SCHEMA)

#: Columns that lead every output row: the Kafka record that produced it.
ORIGIN_FIELDS = (
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
)

#: Column that ends every output row: the micro-batch that wrote it.
BATCH_ID_FIELD = pa.field("batch_id", pa.int64(), nullable=False)


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One Kafka record with its coordinates; the unit the engine and reference runner apply."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: datetime | None = None
    headers: tuple[Header, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A Kafka topic-partition; orders by topic then partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"
