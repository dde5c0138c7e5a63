"""The checkpoint's info file as a record, and Spark's logs read through the storage layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inorder.checkpoint import CheckpointInfo, CheckpointInfoError, CheckpointLayout
from inorder.kafka.offsets import SourceOffset
from inorder.records import TopicPartition

#: An info file as the previous release wrote it after a repair (and a key it did not know).
OLD_INFO = {
    "id": "0f3c",
    "pipeline": {"name": "sessions", "processor": "m:P"},
    "settings": {"source": "pipeline.toml", "recorded_at": "2026-01-02T03:04:05+00:00"},
    "history": [],
    "batch_offset": 7,
    "startingOffsets": {"t": {"0": 42}},
    "repaired": {"at": "x", "backup": "/ck.bak-1", "failure_points": {"t": {"0": 50}}},
    "future_field": {"kept": True},
}


def test_an_old_info_file_reads_and_writes_back_what_it_held(tmp_path: Path) -> None:
    (tmp_path / "inorder-checkpoint.json").write_text(json.dumps(OLD_INFO))
    layout = CheckpointLayout.of(tmp_path)
    info = layout.info()
    assert info is not None
    assert (info.id, info.offset, info.starting_offsets) == ("0f3c", 7, {"t": {"0": 42}})
    assert info.failure_points == {"t": {"0": 50}} and info.repair_pending is None
    assert info.identity == OLD_INFO["pipeline"] and info.settings == OLD_INFO["settings"]
    layout.write_info(info)
    assert layout.read_info() == {k: v for k, v in OLD_INFO.items() if k != "history"}
    assert layout.owner() == "0f3c"


def test_missing_and_odd_fields_read_as_absent() -> None:
    info = CheckpointInfo.from_json({"id": 3, "history": "x", "repair_pending": None})
    assert info.id is None and info.history == () and info.offset == 0
    assert info.repair_pending == {}  # present at all: a repair did not finish
    assert CheckpointInfo().to_json() == {}


def test_a_changed_identity_goes_to_the_history() -> None:
    info = CheckpointInfo(id="a", identity={"name": "v1"})
    after = info.with_identity({"name": "v2"}, {"s": 1}, {"name": "v1"}, "then")
    assert after.history == ({"until": "then", "pipeline": {"name": "v1"}},)
    assert after.identity == {"name": "v2"} and after.id == "a"
    assert info.with_identity({"name": "v1"}, {}).history == ()
    assert after.pipeline_part() == CheckpointInfo(
        identity={"name": "v2"}, settings={"s": 1}, history=after.history
    )


def test_a_damaged_info_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "inorder-checkpoint.json").write_text("{not json")
    with pytest.raises(CheckpointInfoError, match="is damaged"):
        CheckpointLayout.of(tmp_path).info()


def test_spark_log_reads_planned_and_committed_batches(tmp_path: Path) -> None:
    a = TopicPartition("t", 0)
    offsets, commits = tmp_path / "spark" / "offsets", tmp_path / "spark" / "commits"
    offsets.mkdir(parents=True)
    commits.mkdir(parents=True)
    for batch_id, end in ((0, 10), (1, 25)):
        entry = SourceOffset({a: end}, starts={a: 3} if batch_id == 0 else {}).to_json()
        (offsets / str(batch_id)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{entry}')
    (offsets / "2").write_text("v1\n{damaged")
    (commits / "0").write_text("v1\n{}")
    log = CheckpointLayout.of(tmp_path).spark_log
    assert log.planned() == [0, 1, 2] and log.committed() == [0]
    batches = log.batches()
    assert [(b.batch_id, b.committed, b.end) for b in batches] == [
        (0, True, {a: 10}),
        (1, False, {a: 25}),
    ]
    assert batches[0].starts == {a: 3} and batches[0].committed_at is not None
    assert log.last_committed() == batches[0]
