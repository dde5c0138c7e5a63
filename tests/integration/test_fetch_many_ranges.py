"""One consumer reading several planned ranges at once (``inorder.kafka.fetch``), real broker.

A task reads all its ranges with one consumer, so the partitions' records interleave. Each
partition must still get exactly its range, in offset order: nothing from before ``start`` or
from ``end`` on, nothing twice, nothing missing; an expired range skipped (or named) without
disturbing the partitions read beside it; and an engine task given several ranges of one
partition reads them in order.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as CTP
from confluent_kafka.admin import AdminClient

from inorder.errors import DataLossError
from inorder.kafka.consumer import read_ranges_records
from inorder.kafka.fetch import fetch_runs
from inorder.kafka.options import SourceOptions, parse_options
from inorder.records import TopicPartition


def _options(kafka: Any, topic: str, **extra: str) -> SourceOptions:
    return parse_options(
        {
            "kafka.bootstrap.servers": kafka.bootstrap_servers,
            "subscribe": topic,
            "inorder.batchRows": "64",  # many fetches, partitions mixed within them
            **extra,
        }
    )


def _produce(kafka: Any, topic: str, partitions: int, per_partition: int) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 0})
    for i in range(per_partition):
        for p in range(partitions):
            producer.produce(topic, value=f"p{p}-{i}".encode(), partition=p)
    producer.flush(30)


def _by_partition(
    options: SourceOptions, ranges: list[tuple[TopicPartition, int, int]]
) -> tuple[dict[int, list[tuple[int, bytes]]], list[int]]:
    """Offsets and values read per partition, and the partition of each chunk in order."""
    seen: dict[int, list[tuple[int, bytes]]] = {}
    order: list[int] = []
    for tp, chunk in read_ranges_records(options, ranges):
        order.append(tp.partition)
        seen.setdefault(tp.partition, []).extend((t[0], t[2]) for t in chunk)  # type: ignore[misc]
    return seen, order


def test_each_partition_gets_exactly_its_range_in_offset_order(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=4)
    _produce(kafka, topic, 4, 500)
    tps = [TopicPartition(topic, p) for p in range(4)]
    ranges = [(tps[0], 0, 500), (tps[1], 37, 401), (tps[2], 250, 251), (tps[3], 499, 500)]
    seen, order = _by_partition(_options(kafka, topic), ranges)
    for tp, start, end in ranges:
        assert seen[tp.partition] == [
            (o, f"p{tp.partition}-{o}".encode()) for o in range(start, end)
        ], tp
    assert sorted(set(order)) == [0, 1, 2, 3]


def test_empty_ranges_are_skipped_and_one_range_alone_works(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=2)
    _produce(kafka, topic, 2, 50)
    tps = [TopicPartition(topic, p) for p in range(2)]
    seen, _ = _by_partition(_options(kafka, topic), [(tps[0], 10, 10), (tps[1], 5, 20)])
    assert list(seen) == [1] and [o for o, _ in seen[1]] == list(range(5, 20))
    assert list(fetch_runs(_options(kafka, topic), [(tps[0], 3, 3)])) == []


def test_two_ranges_of_one_partition_in_one_read_are_refused(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    with pytest.raises(ValueError, match="one range per partition"):
        list(fetch_runs(_options(kafka, topic), [(tp, 0, 5), (tp, 5, 9)]))


def test_an_expired_range_beside_others_is_skipped_or_named(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=3)
    _produce(kafka, topic, 3, 200)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.delete_records([CTP(topic, 1, 120)])[CTP(topic, 1, 120)].result(15)
    tps = [TopicPartition(topic, p) for p in range(3)]
    ranges = [(tps[0], 0, 200), (tps[1], 50, 200), (tps[2], 100, 200)]
    with pytest.raises(DataLossError, match=rf"{topic}.*partition 1.*\b50\b"):
        _by_partition(_options(kafka, topic), ranges)
    seen, _ = _by_partition(_options(kafka, topic, failOnDataLoss="false"), ranges)
    assert [o for o, _ in seen[0]] == list(range(0, 200))
    assert [o for o, _ in seen[1]] == list(range(120, 200))  # from the new log start on
    assert [o for o, _ in seen[2]] == list(range(100, 200))
