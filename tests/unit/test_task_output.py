"""A task's output gathers its topic-partitions' rows and hands them to the writer together.

The real Parquet sink on local disk; the writer is wrapped only to count its calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inorder.engine import task_output
from inorder.engine.task_output import TaskOutput
from inorder.sinks.base import BatchWriter, WrittenFile
from inorder.sinks.parquet import ParquetSink

SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])


class CountingSink(ParquetSink):
    """The Parquet sink, counting the rows of each call its writers get."""

    calls: list[int]

    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        inner = super().open_writer(schema, batch_id, task_key)
        calls = self.calls

        class Counting(BatchWriter):
            def write(self, batch: pa.RecordBatch) -> None:
                calls.append(batch.num_rows)
                inner.write(batch)

            def close(self) -> list[WrittenFile]:
                return inner.close()

            def abort(self) -> None:
                inner.abort()

        return Counting()


def _sink(root: Path, **kwargs: Any) -> CountingSink:
    sink = CountingSink(str(root), **kwargs)
    sink.calls = []
    sink.check(SCHEMA)
    return sink


def _partition_rows(topic: str, partition: int, first: int, n: int) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(range(first, first + n), pa.int64()),
        ],
        schema=SCHEMA,
    )


def _staged_rows(root: Path, files: list[WrittenFile]) -> list[tuple[str, int, int]]:
    rows = []
    for f in files:
        table = pq.read_table(root / f.path)
        topic = f.partition_values.get("topic")
        for p, o in zip(
            table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True
        ):
            rows.append((str(topic), int(p), int(o)))
    return rows


def test_many_small_partitions_reach_the_writer_in_one_call(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "out", partition_by=["topic"])
    output = TaskOutput(sink, SCHEMA, batch_id=0)
    written = []
    for t in range(300):
        for p in range(2):
            batch = _partition_rows(f"site-{t:03d}", p, 10 * p, 5)
            output.write(batch)
            written += [(f"site-{t:03d}", p, 10 * p + i) for i in range(5)]
    assert sink.calls == []  # gathered, not yet handed over
    files = output.close()
    assert sink.calls == [3000]
    assert len(files) == 300  # one file per output partition (topic), as before
    # Every row once, each topic-partition's rows in the order they were written.
    assert sorted(_staged_rows(tmp_path / "out", files)) == sorted(written)
    for f in files:
        table = pq.read_table(tmp_path / "out" / f.path)
        assert table.column("partition").to_pylist() == [0] * 5 + [1] * 5
        assert table.column("offset").to_pylist() == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]


def test_rows_are_handed_over_once_the_threshold_is_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_output, "COALESCE_ROWS", 12)
    sink = _sink(tmp_path / "out", partition_by=["topic"])
    output = TaskOutput(sink, SCHEMA, batch_id=0)
    for i in range(7):
        output.write(_partition_rows("site-a", i, 0, 5))
    output.write(_partition_rows("site-a", 7, 0, 0))  # an empty batch changes nothing
    # 5 + 5 + 5 >= 12: handed over after the third and the sixth write; the seventh waits.
    assert sink.calls == [15, 15]
    files = output.close()
    assert sink.calls == [15, 15, 5]
    assert sum(f.rows for f in files) == 35


def test_a_large_batch_goes_to_the_writer_after_what_was_gathered(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "out", partition_by=["topic"])
    output = TaskOutput(sink, SCHEMA, batch_id=0)
    output.write(_partition_rows("site-a", 0, 0, 5))
    output.write(_partition_rows("site-a", 1, 0, 5))
    large = task_output.GATHER_BELOW_ROWS
    output.write(_partition_rows("site-a", 2, 0, large))
    assert sink.calls == [10, large]
    output.write(_partition_rows("site-a", 3, 0, 5))
    files = output.close()
    assert sink.calls == [10, large, 5]
    (only,) = files
    table = pq.read_table(tmp_path / "out" / only.path)
    assert table.column("partition").to_pylist() == [0] * 5 + [1] * 5 + [2] * large + [3] * 5


def test_an_aborted_output_stages_nothing(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "out", partition_by=["topic"])
    output = TaskOutput(sink, SCHEMA, batch_id=0)
    output.write(_partition_rows("site-a", 0, 0, 5))
    output.abort()
    assert output.close() == []
    assert sink.calls == []
    assert not list((tmp_path / "out").rglob("*.parquet"))
