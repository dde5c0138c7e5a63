"""A long micro-batch is not silence: the runner shows it while it runs."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from tests.e2e.cli_jobs import GatedCountRaw, SlowCountRaw
from tests.e2e.test_run_fatal_errors import _produce

from inorder import KafkaSource, ParquetSink, Pipeline
from inorder.codecs.raw import RawCodec
from inorder.pipeline.progress import PlainReporter, RunningBatch, format_running
from inorder.pipeline.runner import PipelineRunner


def test_a_running_batch_is_shown(kafka: Any, spark: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(f"live-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, 0, 40)  # 40 x 0.1 s: one batch of ~4 s
    pipeline = Pipeline(
        source=KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topics=[topic]),
        processor=SlowCountRaw(),
        codec=RawCodec(),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
        spark_master="local[2]",
    )
    stream = io.StringIO()
    PipelineRunner(pipeline, reporter=PlainReporter(stream, heartbeat_seconds=1.0)).run()
    lines = stream.getvalue().splitlines()
    running = [line for line in lines if line.startswith("batch 0 running for")]
    assert len(running) >= 2, lines
    assert all("40 records planned" in line for line in running), running
    assert any("tasks 0/1" in line for line in running), running
    finished = next(i for i, line in enumerate(lines) if line.startswith("batch 0 "))
    assert lines.index(running[0]) <= finished


class _Watching(PlainReporter):
    """Keeps every running-batch status; creates ``flag`` once one shows ``applied`` records."""

    def __init__(self, flag: Path, applied: int) -> None:
        super().__init__(io.StringIO(), heartbeat_seconds=0.0)
        self.flag, self.applied = flag, applied
        self.seen: list[RunningBatch] = []

    def running(self, status: RunningBatch) -> None:
        self.seen.append(status)
        if (status.applied_records or 0) >= self.applied:
            self.flag.touch()


def test_records_applied_show_while_the_batch_runs(kafka: Any, spark: Any, tmp_path: Path) -> None:
    # Partition 0: 30 records. Partition 1: a record that holds its task until the driver
    # has shown partition 0's 30 records as applied, then 9 more. Two tasks (local[2]), so
    # the count can only come from the running batch, placed by the event, not by time.
    topic = kafka.new_topic(f"applied-{random.randrange(10**9)}", partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(30):
        producer.produce(topic, key=f"k{i % 3}", value=b"%d" % i, partition=0)
    producer.produce(topic, key="g", value=b"gate", partition=1)
    for i in range(9):
        producer.produce(topic, key=f"h{i % 3}", value=b"%d" % i, partition=1)
    assert producer.flush(30) == 0
    flag = tmp_path / "shown"
    pipeline = Pipeline(
        source=KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topics=[topic]),
        processor=GatedCountRaw(str(tmp_path / "waiting"), str(flag)),
        codec=RawCodec(),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
        spark_master="local[2]",
    )
    reporter = _Watching(flag, 30)
    summary = PipelineRunner(pipeline, reporter=reporter).run()
    assert summary.records == 40
    shown = [s for s in reporter.seen if s.applied_records]
    assert shown and shown[0].batch_id == 0 and shown[0].planned_records == 40, shown
    assert 30 <= shown[0].applied_records < 40, shown  # type: ignore[operator]
    assert "of 40 records applied" in format_running(shown[0])


def test_plain_heartbeat_spacing() -> None:
    stream = io.StringIO()
    reporter = PlainReporter(stream, heartbeat_seconds=10)
    for second in range(0, 35):
        reporter.running(RunningBatch(7, float(second), 1, 4, 1000))
    lines = stream.getvalue().splitlines()
    assert lines == [
        format_running(RunningBatch(7, 10.0, 1, 4, 1000)),
        format_running(RunningBatch(7, 20.0, 1, 4, 1000)),
        format_running(RunningBatch(7, 30.0, 1, 4, 1000)),
    ]
    assert lines[0] == "batch 7 running for 10 s, tasks 1/4, 1,000 records planned"
