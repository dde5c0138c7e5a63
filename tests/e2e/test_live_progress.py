"""A long micro-batch is not silence: the runner shows it while it runs."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

from tests.e2e.cli_jobs import SlowCountRaw
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
