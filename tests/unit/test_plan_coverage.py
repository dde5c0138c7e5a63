"""A micro-batch's task results must cover the ranges the source planned for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inorder.checkpoint.spark_log import SparkLog
from inorder.engine.plan_coverage import (
    PlanNotCovered,
    check_coverage,
    planned_ranges,
    uncovered,
)
from inorder.engine.results import TaskResult
from inorder.kafka.offsets import SourceOffset
from inorder.records import TopicPartition as TP

A0, A1, B2 = TP("site-a", 0), TP("site-a", 1), TP("site-b", 2)


def result(tp: TP, planned: list[int] | None) -> TaskResult:
    return TaskResult(topic=tp.topic, partition=tp.partition, planned=planned)


def test_results_given_every_planned_range_cover_the_plan() -> None:
    planned = {A0: (0, 1639), A1: (5, 5), B2: (0, 1694)}
    results = [result(A0, [0, 1639]), result(A1, [5, 5]), result(B2, [0, 1694])]
    assert uncovered(planned, results) == []
    # An empty range needs no result: nothing of it could be lost.
    assert uncovered(planned, results[::2]) == []
    check_coverage(0, planned, results)


def test_a_planned_range_without_its_result_fails_the_batch_naming_it() -> None:
    planned = {A0: (0, 1639), B2: (0, 1694)}
    assert uncovered(planned, [result(A0, [0, 1639])]) == [
        "site-b[2] offsets 0..1694: no task result"
    ]
    assert uncovered(planned, [result(A0, [0, 1639]), result(B2, [0, 900])]) == [
        "site-b[2] offsets 0..1694: its task was given offsets 0..900"
    ]
    assert uncovered(planned, [result(A0, [0, 1639]), result(B2, None)]) == [
        "site-b[2] offsets 0..1694: its task was given no range"
    ]
    with pytest.raises(PlanNotCovered, match=r"batch 7: 1 planned range\(s\) not read by any "):
        check_coverage(7, planned, [result(A0, [0, 1639])])


def _entry(offset: SourceOffset) -> str:
    # Spark's offsets-log entry: a version line, the batch's metadata, one line per source.
    return "\n".join(["v1", json.dumps({"batchWatermarkMs": 0}), offset.to_json()])


def test_planned_ranges_come_from_the_batch_entry_and_the_one_before(tmp_path: Path) -> None:
    offsets = tmp_path / "spark" / "offsets"
    offsets.mkdir(parents=True)
    first = SourceOffset({A0: 1639, B2: 0}, starts={A0: 0})
    (offsets / "0").write_text(_entry(first))
    (offsets / "1").write_text(_entry(SourceOffset({A0: 1700, B2: 1694, A1: 3}, starts={A1: 0})))
    read = SparkLog.at(str(tmp_path / "spark")).source_offset
    assert planned_ranges(read, 0) == {A0: (0, 1639), B2: (0, 0)}
    assert planned_ranges(read, 1) == {A0: (1639, 1700), A1: (0, 3), B2: (0, 1694)}
    assert planned_ranges(read, 2) is None  # not planned (yet)
    (offsets / "0").unlink()  # Spark's cleanup: the start of batch 1 is not known any more
    assert planned_ranges(read, 1) is None
