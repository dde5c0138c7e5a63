"""In-memory Kafka-shaped DataFrames: the source's partitioning without a broker.

:func:`records_dataframe` lays out records exactly as the Kafka source does with
``inorder.partitionMarkers=true``: one Spark partition per topic-partition (in sorted order),
a marker row first, then the records in the given (offset) order. Tests and benchmarks use it
to drive the partition backend with no broker.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from inorder.engine.context import to_micros
from inorder.kafka.markers import MARKER_HEADER, MARKER_TIMESTAMP_TYPE, encode_range
from inorder.records import KAFKA_ARROW_SCHEMA, KAFKA_SPARK_DDL, KafkaRecord, TopicPartition


def partition_table(
    tp: TopicPartition, records: list[KafkaRecord], start: int | None = None
) -> pa.Table:
    """One topic-partition's marker row + records as an Arrow table (Kafka schema)."""
    first = start if start is not None else (records[0].offset if records else 0)
    end = records[-1].offset + 1 if records else first
    rows: list[dict[str, Any]] = [
        {
            "key": None,
            "value": None,
            "topic": tp.topic,
            "partition": tp.partition,
            "offset": first,
            "timestamp": None,
            "timestampType": MARKER_TIMESTAMP_TYPE,
            "headers": [{"key": MARKER_HEADER, "value": encode_range(first, end)}],
        }
    ]
    for r in records:
        rows.append(
            {
                "key": r.key,
                "value": r.value,
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "timestamp": None if r.timestamp is None else to_micros(r.timestamp),
                "timestampType": 0,
                "headers": [{"key": k, "value": v} for k, v in r.headers] or None,
            }
        )
    schema = KAFKA_ARROW_SCHEMA.set(
        KAFKA_ARROW_SCHEMA.get_field_index("timestamp"), pa.field("timestamp", pa.int64())
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    ts = table.column("timestamp").cast(pa.timestamp("us", tz="UTC"))
    return table.set_column(table.schema.get_field_index("timestamp"), "timestamp", ts).cast(
        KAFKA_ARROW_SCHEMA
    )


def _emit(payloads: list[bytes], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for index in batch.column(0).to_pylist():
            with pa.ipc.open_stream(payloads[index]) as reader:
                yield from reader


def records_dataframe(
    spark: Any,
    records: Iterable[KafkaRecord],
    partitions: Iterable[TopicPartition] = (),
    groups: int = 0,
) -> Any:
    """A DataFrame (Kafka schema) with one Spark partition per topic-partition, markers first.

    ``partitions`` adds topic-partitions that get only a marker row (no new records). With
    ``groups`` the topic-partitions are dealt round that many Spark partitions in sorted
    order, as the source's range groups are, each sending its partitions in one Arrow batch.
    """
    by_tp: dict[TopicPartition, list[KafkaRecord]] = {tp: [] for tp in partitions}
    for r in records:
        by_tp.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
    tables = [partition_table(tp, by_tp[tp]) for tp in sorted(by_tp)]
    if groups > 0:
        dealt = [tables[g::groups] for g in range(min(groups, len(tables)))]
        tables = [pa.concat_tables(group).combine_chunks() for group in dealt]
    payloads: list[bytes] = []
    for table in tables:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        payloads.append(sink.getvalue().to_pybytes())
    n = max(len(payloads), 1)
    base = spark.range(0, len(payloads), 1, n)
    return base.mapInArrow(functools.partial(_emit, payloads), KAFKA_SPARK_DDL)
