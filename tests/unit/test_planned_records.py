"""How many records a planned micro-batch covers, read from Spark's offsets log."""

from __future__ import annotations

import json
from pathlib import Path

from inorder.checkpoint import CheckpointLayout
from inorder.kafka.offsets import SourceOffset
from inorder.pipeline.spark_progress import planned_records
from inorder.records import TopicPartition


def _plan(root: Path, batch_id: int, positions: dict[TopicPartition, int]) -> None:
    offsets = root / "spark" / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    entry = ["v1", json.dumps({"batchWatermarkMs": 0}), SourceOffset(positions).to_json()]
    (offsets / str(batch_id)).write_text("\n".join(entry))


def test_records_between_two_planned_batches(tmp_path: Path) -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    _plan(tmp_path, 0, {a: 10, b: 5})
    _plan(tmp_path, 1, {a: 30, b: 5})
    assert CheckpointLayout.of(tmp_path).planned_batches() == [0, 1]
    assert planned_records(CheckpointLayout.of(tmp_path), 1) == 20
    assert planned_records(CheckpointLayout.of(tmp_path), 2) is None  # not planned


def test_a_damaged_entry_is_unknown_not_an_error(tmp_path: Path) -> None:
    _plan(tmp_path, 0, {TopicPartition("t", 0): 10})
    (tmp_path / "spark" / "offsets" / "1").write_text("v1\n{not json")
    assert planned_records(CheckpointLayout.of(tmp_path), 1) is None
    assert CheckpointLayout.of(tmp_path).offsets_entry(7) is None
