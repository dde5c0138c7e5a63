"""The status page's output facts, read from real tables: an Iceberg output is read as
Iceberg (its files, rows, bytes and each batch's rows and files), never as Delta."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from inorder.sinks.base import ConsumedOffsets, WrittenFile
from inorder.ui.status import StatusSource

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("batch_id", pa.int64()),
    ]
)


def _stage(sink: object, batch_id: int, offsets: range) -> list[WrittenFile]:
    writer = sink.open_writer(SCHEMA, batch_id, "a-0")  # type: ignore[attr-defined]
    writer.write(
        pa.record_batch(
            [
                pa.array(["a"] * len(offsets)),
                pa.array([0] * len(offsets), pa.int32()),
                pa.array(list(offsets), pa.int64()),
                pa.array([batch_id] * len(offsets), pa.int64()),
            ],
            schema=SCHEMA,
        )
    )
    files: list[WrittenFile] = writer.close()
    return files


def _source(sink: object) -> StatusSource:
    """A status source over ``sink`` alone (the output facts need nothing else)."""
    target = SimpleNamespace(sink=sink, batch_offset=0)
    return StatusSource("p.toml", target)  # type: ignore[arg-type]


def test_an_iceberg_output_is_read_as_iceberg(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    from inorder.sinks.iceberg import IcebergSink

    sink = IcebergSink("db.events", str(tmp_path / "wh"), catalog_file=str(tmp_path / "catalog.db"))
    sink.bind("ck-ui")
    before = _source(sink)._read_output()
    assert before.kind == "iceberg" and before.rows in (0, None)
    sink.check(SCHEMA)
    sink.commit_consumed(0, _stage(sink, 0, range(0, 10)), [ConsumedOffsets("a", 0, 0, 9)])
    sink.commit_consumed(1, _stage(sink, 1, range(10, 13)), [ConsumedOffsets("a", 0, 10, 12)])
    info = _source(sink)._read_output()
    assert info.kind == "iceberg", info
    assert (info.rows, info.files) == (13, 2) and info.bytes and info.bytes > 0
    assert info.by_batch == {0: (10, 1), 1: (3, 1)}
    assert not info.note and "db.events" in info.location


RESET_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("batch_id", pa.int64()),
        ("session", pa.string()),
        ("op", pa.string()),
    ]
)


def test_a_delta_output_counts_each_batch_and_its_resets(tmp_path: Path) -> None:
    from inorder.sinks.delta import DeltaSink

    sink = DeltaSink(str(tmp_path / "delta"))
    sink.check(RESET_SCHEMA)
    for batch_id, ops in ((0, ["insert"] * 4), (1, ["insert", "reset"])):
        writer = sink.open_writer(RESET_SCHEMA, batch_id, "a-0")
        first = 10 * batch_id
        writer.write(
            pa.record_batch(
                [
                    pa.array(["a"] * len(ops)),
                    pa.array([0] * len(ops), pa.int32()),
                    pa.array(range(first, first + len(ops)), pa.int64()),
                    pa.array([batch_id] * len(ops), pa.int64()),
                    pa.array(["S"] * len(ops)),
                    pa.array(ops),
                ],
                schema=RESET_SCHEMA,
            )
        )
        assert sink.commit(batch_id, writer.close())
    info = _source(sink)._read_output()
    assert info.kind == "delta" and not info.note, info
    assert (info.rows, info.files) == (6, 2)
    # Without a recorded history the page still has each batch's rows and files.
    assert info.by_batch == {0: (4, 1), 1: (2, 1)}
    assert [(r.batch_id, r.first_offset, r.key) for r in info.resets] == [(1, 11, "S")]


def test_a_parquet_output_shows_its_compaction_backlog(tmp_path: Path) -> None:
    from inorder.sinks.parquet import ParquetSink

    sink = ParquetSink(str(tmp_path / "pq"), compaction_fanout=2, compaction_levels=2)
    sink.check(SCHEMA)
    for batch_id in range(3):
        assert sink.commit(
            batch_id, _stage(sink, batch_id, range(10 * batch_id, 10 * batch_id + 5))
        )
    info = _source(sink)._read_output()
    assert info.kind == "parquet" and (info.rows, info.files) == (15, 3), info
    assert info.compaction == "level 0: 3; 1 merge(s) of 2 files due", info.compaction
