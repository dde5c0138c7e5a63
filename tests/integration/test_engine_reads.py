"""The engine task's own Kafka reads (``inorder.rangesOnly``) against the real broker.

They must hand the applier exactly what the source's Arrow path hands it: the same offsets,
keys, values, timestamps and headers, aborted transactions hidden, offset gaps not loss,
expired offsets a named DataLossError.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as CTP
from confluent_kafka.admin import AdminClient

from inorder.engine.task import _record_tuples
from inorder.errors import DataLossError
from inorder.kafka.consumer import read_range, read_records
from inorder.kafka.input_partitions import KafkaInputPartition
from inorder.kafka.options import SourceOptions, parse_options
from inorder.kafka.source import KafkaStreamReader
from inorder.records import TopicPartition


def _options(kafka: Any, topic: str, **extra: str) -> SourceOptions:
    return parse_options(
        {
            "kafka.bootstrap.servers": kafka.bootstrap_servers,
            "subscribe": topic,
            "inorder.batchRows": "7",  # several fetches per range
            **extra,
        }
    )


def _via_arrow(options: SourceOptions, tp: TopicPartition, start: int, end: int) -> list[Any]:
    # No headers is None here and [] there on a row whose neighbours have some: the
    # processor sees () for both (EngineContext.headers).
    return [
        (*t[:4], t[4] or None)
        for batch in read_range(options, tp, start, end, markers=False)
        for t in _record_tuples(batch)
    ]


def _via_engine(options: SourceOptions, tp: TopicPartition, start: int, end: int) -> list[Any]:
    return [t for chunk in read_records(options, tp, start, end) for t in chunk]


def test_engine_reads_match_the_arrow_path(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=1)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{topic}"}
    )
    producer.init_transactions(15)
    for round_ in range(3):
        producer.begin_transaction()
        for i in range(10):
            headers = [("h", f"{round_}-{i}".encode())] if i % 3 == 0 else None
            key = None if i == 4 else f"k{i}".encode()
            producer.produce(topic, key=key, value=f"v{round_}-{i}".encode(), headers=headers)
        producer.commit_transaction(15)
        producer.begin_transaction()
        producer.produce(topic, value=b"aborted")
        producer.abort_transaction(15)
    tp = TopicPartition(topic, 0)
    end = kafka_end(kafka, topic)
    for include in ("false", "true"):
        options = _options(kafka, topic, includeHeaders=include)
        for start, stop in ((0, end), (5, 17), (3, 3)):
            engine = _via_engine(options, tp, start, stop)
            assert engine == _via_arrow(options, tp, start, stop)
            assert all(start <= t[0] < stop for t in engine)
        everything = _via_engine(options, tp, 0, end)
        assert [t[2] for t in everything] == [
            f"v{r}-{i}".encode() for r in range(3) for i in range(10)
        ]
        assert all(t[3] is not None for t in everything)
        if include == "true":
            assert everything[0][4] == [("h", b"0-0")] and everything[1][4] is None


def _produce_values(kafka: Any, topic: str, n: int) -> None:
    """Records ``v0`` .. ``v<n-1>`` (no key) to partition 0 of ``topic``."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(n):
        producer.produce(topic, value=f"v{i}".encode())
    producer.flush(30)


def test_engine_reads_name_expired_offsets(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=1)
    _produce_values(kafka, topic, 40)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.delete_records([CTP(topic, 0, 20)])[CTP(topic, 0, 20)].result(15)
    tp = TopicPartition(topic, 0)
    with pytest.raises(DataLossError, match=rf"{topic}.*\b10\b"):
        _via_engine(_options(kafka, topic), tp, 10, 40)
    skipped = _via_engine(_options(kafka, topic, failOnDataLoss="false"), tp, 10, 40)
    assert [t[0] for t in skipped] == list(range(20, 40))


def test_a_ranges_only_source_yields_only_the_marker(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=1)
    _produce_values(kafka, topic, 5)
    options = _options(kafka, topic, **{"inorder.partitionMarkers": "true"})
    ranges_only = _options(
        kafka, topic, **{"inorder.partitionMarkers": "true", "inorder.rangesOnly": "true"}
    )
    part = KafkaInputPartition(topic, 0, 0, 5)
    full = list(KafkaStreamReader(options).read(part))
    markers = list(KafkaStreamReader(ranges_only).read(part))
    assert sum(b.num_rows for b in full) == 6
    assert len(markers) == 1 and markers[0].num_rows == 1
    assert markers[0].to_pylist() == full[0].to_pylist()


def kafka_end(kafka: Any, topic: str) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "probe"})
    try:
        return int(consumer.get_watermark_offsets(CTP(topic, 0), timeout=15)[1])
    finally:
        consumer.close()


class _Node:
    """An object that can sit in a reference cycle."""

    me: _Node | None = None


def test_cyclic_garbage_made_while_a_range_is_applied_is_freed(kafka: Any) -> None:
    import weakref

    topic = kafka.new_topic(partitions=1)
    _produce_values(kafka, topic, 30)
    chunks = read_records(_options(kafka, topic), TopicPartition(topic, 0), 0, 30)
    next(chunks)
    node = _Node()
    node.me = node  # garbage only the cyclic GC can free, made "by the processor"
    ref = weakref.ref(node)
    del node
    next(chunks)  # the reader's pause of the GC is still on, between the two chunks
    assert ref() is None
    chunks.close()
