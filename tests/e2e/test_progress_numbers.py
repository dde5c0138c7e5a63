"""The progress line after a restart, over a real broker and Spark: the batch Spark re-runs
from its offsets log was not planned by this run, so its lag is unknown ("?"), never 0
while records remain; the batches this run plans measure it again."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

from tests.e2e.cli_jobs import CountRaw
from tests.e2e.test_run_fatal_errors import _produce

from inorder import KafkaSource, ParquetSink, Pipeline
from inorder.codecs.raw import RawCodec
from inorder.pipeline.progress import JsonReporter
from inorder.pipeline.runner import PipelineRunner


def _pipeline(bootstrap: str, topic: str, tmp_path: Path) -> Pipeline:
    return Pipeline(
        source=KafkaSource(
            bootstrap_servers=bootstrap, topics=[topic], max_offsets_per_trigger=100
        ),
        processor=CountRaw(),
        codec=RawCodec(),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
        spark_master="local[2]",
    )


def _batches(stream: io.StringIO) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [e for e in events if e["event"] == "batch"]


def test_the_batch_re_run_after_a_restart_has_no_false_zero_lag(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"lag-restart-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, 0, 300)
    first = io.StringIO()
    # Stopped after batch 0: Spark has planned batch 1 already (its offsets are in the log)
    # and the next start re-runs it from there.
    PipelineRunner(
        _pipeline(kafka.bootstrap_servers, topic, tmp_path),
        reporter=JsonReporter(first),
        stop_after_batches=1,
    ).run()
    (line,) = _batches(first)
    assert (line["batch_id"], line["records"], line["lag"]) == (0, 100, 200)
    assert (tmp_path / "ck" / "spark" / "offsets" / "1").exists()
    second = io.StringIO()
    PipelineRunner(
        _pipeline(kafka.bootstrap_servers, topic, tmp_path), reporter=JsonReporter(second)
    ).run()
    lines = _batches(second)
    assert [(b["batch_id"], b["records"]) for b in lines] == [(1, 100), (2, 100)], lines
    # 100 records were still to read when batch 1 re-ran: its lag is unknown, not 0.
    assert lines[0]["lag"] is None, lines[0]
    # The batch this run planned measures it again.
    assert lines[1]["lag"] == 0
