"""Processors, a producer and job entry points for the archive and versioned-job tests.

Run as ``python -m tests.integration.archive_support archive|pipeline ...`` (from the
repository root) for the kill -9 tests; imported by the tests otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from inorder.processor import Context, Processor


@dataclass
class Msg:
    """A test message."""

    k: str
    v: int


@dataclass
class Count:
    """v1 state."""

    n: int = 0
    total: int = 0


@dataclass
class CountV2:
    """v2 state: a new field with a default."""

    n: int = 0
    total: int = 0
    max_v: int = 0


@dataclass
class Row:
    """v1 output."""

    k: str
    n: int
    total: int


@dataclass
class RowV2:
    """v2 output: a new column."""

    k: str
    n: int
    total: int
    max_v: int


class CounterV1(Processor[Msg, Count, Row]):
    """Running count and total per key."""

    def key(self, msg: Msg) -> str:
        return msg.k

    def initial_state(self, key: str) -> Count:
        return Count()

    def process(self, state: Count, msg: Msg, ctx: Context) -> Iterable[Row]:
        state.n += 1
        state.total += msg.v
        yield Row(msg.k, state.n, state.total)


class CounterV2(Processor[Msg, CountV2, RowV2]):
    """v1 plus the largest value seen (from the upgrade on)."""

    def key(self, msg: Msg) -> str:
        return msg.k

    def initial_state(self, key: str) -> CountV2:
        return CountV2()

    def process(self, state: CountV2, msg: Msg, ctx: Context) -> Iterable[RowV2]:
        state.n += 1
        state.total += msg.v
        state.max_v = max(state.max_v, msg.v)
        yield RowV2(msg.k, state.n, state.total, state.max_v)


def register_for_spark() -> None:
    """Ship this module's classes to Spark workers by value (tests are not installed)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


def produce(bootstrap: str, topic: str, count: int, partitions: int, first: int = 0) -> None:
    """``count`` messages over ``partitions``, in transactions of 40 (commit markers leave
    offset gaps), with one aborted transaction per partition (never to be read)."""
    import uuid

    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"archive-test-{uuid.uuid4().hex}",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(10)
    i = first
    end = first + count
    while i < end:
        producer.begin_transaction()
        for _ in range(min(40, end - i)):
            p = i % partitions
            value = json.dumps({"k": f"k{i % 23}", "v": (i * 7919) % 1000}).encode()
            producer.produce(topic, value=value, key=f"k{i % 23}".encode(), partition=p)
            i += 1
        producer.commit_transaction(10)
        if i - first == 80:
            producer.begin_transaction()
            for p in range(partitions):
                producer.produce(topic, value=b'{"k": "aborted", "v": 1}', partition=p)
            producer.abort_transaction(10)
    producer.flush(10)


def run_archive(bootstrap: str, topic: str, path: str, checkpoint: str, trigger: str) -> None:
    """The archiver over ``topic`` in small batches."""
    from inorder.kafka.api import KafkaSource
    from inorder.pipeline.archiver import Archive

    Archive(
        source=KafkaSource(bootstrap, topics=[topic], max_offsets_per_trigger=100),
        path=path,
        checkpoint=checkpoint,
        trigger=trigger,
        spark_master="local[2]",
    ).run()


def run_pipeline(
    bootstrap: str,
    topic: str,
    archive: str | None,
    out: str,
    checkpoint: str,
    trigger: str,
    max_offsets: int = 70,
) -> Any:
    """The v1 counter over ``topic`` (through the archive when given)."""
    from inorder.codecs.json import JsonCodec
    from inorder.kafka.api import KafkaSource
    from inorder.pipeline.pipeline import Pipeline
    from inorder.sinks.parquet import ParquetSink

    return Pipeline(
        source=KafkaSource(
            bootstrap, topics=[topic], archive=archive, max_offsets_per_trigger=max_offsets
        ),
        processor=CounterV1(),
        codec=JsonCodec(Msg),
        sink=ParquetSink(out),
        checkpoint=checkpoint,
        trigger=trigger,
        spark_master="local[2]",
        progress="quiet",
    ).run()


def main() -> None:
    """Entry point of the kill -9 subprocesses."""
    register_for_spark()
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["archive", "pipeline"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--archive", default=None)
    parser.add_argument("--out", default="")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--max-offsets", type=int, default=70)
    args = parser.parse_args()
    if args.what == "archive":
        run_archive(args.bootstrap, args.topic, args.archive, args.checkpoint, args.trigger)
    else:
        run_pipeline(
            args.bootstrap,
            args.topic,
            args.archive,
            args.out,
            args.checkpoint,
            args.trigger,
            args.max_offsets,
        )


if __name__ == "__main__":
    main()
