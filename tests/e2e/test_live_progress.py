"""A long micro-batch is not silence: the runner shows it while it runs."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from tests.e2e.cli_jobs import GatedCountRaw

from inorder import KafkaSource, ParquetSink, Pipeline
from inorder.codecs.raw import RawCodec
from inorder.pipeline.progress import PlainReporter, RunningBatch, format_running
from inorder.pipeline.runner import PipelineRunner


class _OpensWhenShown(PlainReporter):
    """Prints every running-batch status; creates ``flag`` once ``lines`` of them were shown
    while the batch's task was still held (no task done)."""

    def __init__(self, stream: io.StringIO, flag: Path, lines: int) -> None:
        super().__init__(stream, heartbeat_seconds=0.0)
        self.stream, self.flag, self.lines, self.held = stream, flag, lines, 0

    def running(self, status: RunningBatch) -> None:
        before = self.stream.tell()
        super().running(status)
        # The reporter prints nothing for a batch's first status: count lines shown, not calls.
        shown = self.stream.tell() > before
        if shown and status.tasks_total and status.tasks_done == 0:
            self.held += 1
            if self.held >= self.lines:
                self.flag.touch()


@pytest.mark.timeout(600)  # a gate never opened fails, not hangs
def test_a_running_batch_is_shown(kafka: Any, spark: Any, tmp_path: Path) -> None:
    # The batch's first record holds its task until the runner has shown the running batch
    # twice: the lines come from the batch while it runs, placed by that event, not by time.
    topic = kafka.new_topic(f"live-{random.randrange(10**9)}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(topic, key="g", value=b"gate")
    for i in range(39):
        producer.produce(topic, key=f"k{i % 7}", value=b"%d" % i)
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
    stream = io.StringIO()
    summary = PipelineRunner(pipeline, reporter=_OpensWhenShown(stream, flag, 2)).run()
    assert summary.records == 40
    lines = stream.getvalue().splitlines()
    running = [line for line in lines if line.startswith("batch 0 running for")]
    held = [line for line in running if "tasks 0/1" in line]
    assert len(held) >= 2, lines
    # The two lines that opened the gate were shown before any record was applied: they say
    # what is planned. Later ones may say how many of those are applied.
    assert all("40 records planned" in line for line in held[:2]), held
    assert all("40 records" in line for line in running), running
    finished = next(i for i, line in enumerate(lines) if re.match(r"batch +0 +records", line))
    assert lines.index(running[0]) < finished, lines


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


@pytest.mark.timeout(600)  # a gate never opened fails, not hangs
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
