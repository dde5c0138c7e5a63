"""The progress line after a restart, over a real broker and Spark: the batch Spark re-runs
from its offsets log was not planned by this run, so Spark measured no lag for it; the
broker tells it (never 0 while records remain), and ``inspect`` gives it the time the run
that committed it measured."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.ops.inspect import format_inspect, inspect_all
from inorder.pipeline.batch_history import read_history
from inorder.pipeline.config import load_toml, validate
from inorder.pipeline.progress import JsonReporter
from inorder.pipeline.runner import PipelineRunner


def _pipeline(tmp_path: Path, bootstrap: str, topic: str, flag: Path) -> Path:
    """100 records a batch; a ``boom`` record fails its batch while ``flag`` exists."""
    config = validate(
        {
            "pipeline": {"checkpoint": str(tmp_path / "ck"), "trigger": "available-now"},
            "source": {
                "bootstrap_servers": bootstrap,
                "topics": [topic],
                "max_offsets_per_trigger": 100,
            },
            "codec": {"type": "raw"},
            "processor": {
                "type": "tests.e2e.failing_jobs:FailWhileFlagged",
                "options": {"flag": str(flag)},
            },
            "sink": {"path": str(tmp_path / "out")},
            "spark": {"master": "local[1]"},
        }
    )
    path = tmp_path / "p.toml"
    path.write_text(dump_toml(config))
    return path


def _run(toml: Path, stream: io.StringIO) -> None:
    PipelineRunner(build_pipeline(load_toml(str(toml))), reporter=JsonReporter(stream)).run()


def _batches(stream: io.StringIO) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [e for e in events if e["event"] == "batch"]


def test_the_batch_re_run_after_a_restart_has_its_true_lag_and_duration(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"lag-restart-{random.randrange(10**9)}")
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for value in [b"r"] * 100 + [b"boom"] + [b"r"] * 199:
        producer.produce(topic, value)
    assert producer.flush(30) == 0
    flag = tmp_path / "fail"
    flag.touch()
    toml = _pipeline(tmp_path, kafka.bootstrap_servers, topic, flag)
    first = io.StringIO()
    # Batch 1 (offsets 100-199) fails: Spark planned it, nothing of it is committed, and
    # the next start re-runs it from the offsets log.
    with pytest.raises(Exception, match="boom"):
        _run(toml, first)
    (line,) = _batches(first)
    assert (line["batch_id"], line["records"], line["lag"]) == (0, 100, 200)
    flag.unlink()
    second = io.StringIO()
    _run(toml, second)
    lines = _batches(second)
    assert [(b["batch_id"], b["records"]) for b in lines] == [(1, 100), (2, 100)], lines
    # 100 records were still to read when batch 1 re-ran: Spark measured no lag for it
    # (it reports the batch's end as the latest offset: "lag 0"); the broker says 100.
    assert lines[0]["lag"] == 100, lines[0]
    # The batch this run planned measures it again.
    assert lines[1]["lag"] == 0

    # inspect: batch 1 took what the run that committed it measured, not the time from
    # its planning in the first run to its commit in the second (the pause and a start-up).
    doc = inspect_all(load_target(str(toml)), True, False, limit=None)
    shown = {b["batch_id"]: b for b in doc["batches"]}
    recorded = read_history(CheckpointLayout.of(tmp_path / "ck"))
    assert shown[1]["duration_seconds"] == round(recorded[1]["duration_seconds"], 3)
    assert shown[1]["restarted"] and not shown[0]["restarted"] and not shown[2]["restarted"]
    assert any("re-run after a restart" in text for text in format_inspect(doc))
