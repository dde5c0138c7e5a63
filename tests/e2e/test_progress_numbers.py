"""The progress line after a restart, over a real broker and Spark: the batch Spark re-runs
from its offsets log was not planned by this run, so its lag is unknown ("?"), never 0
while records remain; the batches this run plans measure it again."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

from tests.e2e.test_run_fatal_errors import _pipeline, _produce

from inorder.ops.inspect import format_inspect, inspect_all
from inorder.ops.target import OpsTarget
from inorder.pipeline.batch_history import read_history
from inorder.pipeline.config import build_pipeline, load_toml
from inorder.pipeline.progress import JsonReporter
from inorder.pipeline.runner import PipelineRunner


def _run(toml: Path, stream: io.StringIO, stop_after: int | None = None) -> None:
    pipeline = build_pipeline(load_toml(str(toml)))
    PipelineRunner(pipeline, reporter=JsonReporter(stream), stop_after_batches=stop_after).run()


def _batches(stream: io.StringIO) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [e for e in events if e["event"] == "batch"]


def test_the_batch_re_run_after_a_restart_has_no_false_zero_lag_nor_a_duration_across_runs(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"lag-restart-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, 0, 300)
    toml = _pipeline(tmp_path, kafka.bootstrap_servers, topic, max_offsets_per_trigger=100)
    first = io.StringIO()
    # Stopped after batch 0: Spark has planned batch 1 already (its offsets are in the log)
    # and the next start re-runs it from there.
    _run(toml, first, stop_after=1)
    (line,) = _batches(first)
    assert (line["batch_id"], line["records"], line["lag"]) == (0, 100, 200)
    assert (tmp_path / "ck" / "spark" / "offsets" / "1").exists()
    second = io.StringIO()
    _run(toml, second)
    lines = _batches(second)
    assert [(b["batch_id"], b["records"]) for b in lines] == [(1, 100), (2, 100)], lines
    # 100 records were still to read when batch 1 re-ran: its lag is unknown, not 0.
    assert lines[0]["lag"] is None, lines[0]
    # The batch this run planned measures it again.
    assert lines[1]["lag"] == 0

    # inspect: batch 1 took what the run that committed it measured, not the time from
    # its planning in the first run to its commit in the second (the pause and a start-up).
    doc = inspect_all(OpsTarget.load(str(toml)), True, False, limit=None)
    shown = {b["batch_id"]: b for b in doc["batches"]}
    recorded = read_history(str(tmp_path / "ck"))
    assert shown[1]["duration_seconds"] == round(recorded[1]["duration_seconds"], 3)
    assert shown[1]["restarted"] and not shown[0]["restarted"] and not shown[2]["restarted"]
    assert any("re-run after a restart" in text for text in format_inspect(doc))
