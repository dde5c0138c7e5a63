"""A task's partitions hand their last rows to the output encoded together, in their order.

The real row encoder, task output and Parquet sink on local disk; the partitions' appliers
are stand-ins holding only what a partition has produced (its rows and their offsets).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest

from inorder.engine import task_partition
from inorder.engine.task_output import TaskOutput
from inorder.engine.task_partition import PartitionWork, flush_together
from inorder.records import TopicPartition
from inorder.schema import RowEncoder
from inorder.sinks.parquet import ParquetSink


@dataclass
class Reading:
    site: str
    count: int


def _output(root: Path) -> tuple[TaskOutput, RowEncoder[Reading]]:
    encoder = RowEncoder(Reading)
    sink = ParquetSink(str(root))
    sink.check(encoder.output_schema)
    return TaskOutput(sink, encoder.output_schema, batch_id=4), encoder


def _part(output: TaskOutput, encoder: Any, topic: str, rows: list[Reading]) -> PartitionWork:
    """A partition that produced ``rows`` (offsets 10, 11, ...), its applier finished."""
    part = PartitionWork.__new__(PartitionWork)
    part.spec = SimpleNamespace(batch_id=4)  # type: ignore[assignment]
    part.tp = TopicPartition(topic, 0)
    part.encoder = encoder
    part.output = output
    part.output_rows = 0
    part.failed = None
    part.timings = {"write": 0.0}
    part.applier = SimpleNamespace(  # type: ignore[assignment]
        rows=list(rows),
        row_offsets=list(range(10, 10 + len(rows))),
        failed=None,
        meta=SimpleNamespace(last_offset=9 + len(rows)),
    )
    return part


def _rows(n: int, tag: str) -> list[Reading]:
    return [Reading(f"{tag}-{i}", i) for i in range(n)]


def _staged(root: Path, output: TaskOutput) -> list[tuple[str, int, int, str, int]]:
    files = output.close()
    out = []
    for f in files:
        t = pq.read_table(root / f.path)
        cols = [t.column(c).to_pylist() for c in ("topic", "offset", "batch_id", "site", "count")]
        out += list(zip(*cols, strict=True))
    return [(t, o, b, s, c) for t, o, b, s, c in out]


@pytest.mark.parametrize(("gather_rows", "alone_from"), [(16_384, 1_024), (7, 5)])
def test_gathered_rows_equal_rows_flushed_one_partition_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gather_rows: int, alone_from: int
) -> None:
    # Small bounds: chunks of a few partitions, and the partition of 9 rows encoded alone.
    monkeypatch.setattr(task_partition, "GATHER_ROWS", gather_rows)
    monkeypatch.setattr(task_partition, "GATHER_BELOW_ROWS", alone_from)
    shapes = [3] * 40 + [0, 9, 1] + [2] * 10  # one partition with many rows, one with none
    together, encoder = _output(tmp_path / "together")
    alone, _ = _output(tmp_path / "alone")
    parts = [
        _part(together, encoder, f"site-{i:02d}", _rows(n, str(i))) for i, n in enumerate(shapes)
    ]
    singles = [
        _part(alone, encoder, f"site-{i:02d}", _rows(n, str(i))) for i, n in enumerate(shapes)
    ]
    flush_together(parts)
    for p in singles:
        p.flush_last()
    got = _staged(tmp_path / "together", together)
    assert got == _staged(tmp_path / "alone", alone)
    assert len(got) == sum(shapes)
    assert [p.output_rows for p in parts] == shapes
    assert all(p.failed is None and not p.applier.rows and not p.applier.row_offsets for p in parts)


def test_a_row_that_does_not_fit_fails_only_its_partition(tmp_path: Path) -> None:
    output, encoder = _output(tmp_path / "out")
    parts = [_part(output, encoder, f"site-{i}", _rows(3, str(i))) for i in range(20)]
    parts[7].applier.rows[1] = Reading(None, 1)  # type: ignore[arg-type]
    flush_together(parts)
    failed = [p for p in parts if p.failed is not None]
    assert failed == [parts[7]]
    event = parts[7].failed
    assert event is not None and event.topic == "site-7" and event.offset == 12
    assert "Reading.site: None in a non-nullable field (row 1)" in event.detail
    # The others' rows reached the output (the task then deletes it: a partition failed).
    assert sum(p.output_rows for p in parts) == 19 * 3
