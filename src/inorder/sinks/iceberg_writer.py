"""The executor side of the Iceberg sink: a task's rows as Parquet data files, one partition each.

Iceberg readers read only the files a snapshot names, so the task writes straight into the
table's data directory (``<table>/data/<field>=<value>/.../part-<batch>-<attempt>-<n>.parquet``)
and nothing is visible until the driver commits. The files keep every column, partition
columns included: the driver adds them with ``add_files``, which derives each file's
partition from its column statistics, so a file must hold rows of exactly one partition.
Each file's :attr:`WrittenFile.stats` carries the topic-partition offset ranges its writer
saw (``{"inorderOffsets": {"<topic>/<partition>": [first, last]}}``): the driver merges
them into the snapshot summary.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.sinks.base import BatchWriter, WrittenFile
from inorder.sinks.iceberg_catalog import PartitionField
from inorder.sinks.parquet_writer import ParquetBatchWriter
from inorder.storage import fs as sfs

#: Key of the offset ranges in :attr:`WrittenFile.stats`.
OFFSETS_KEY = "inorderOffsets"

_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}
_HOUR_US = 3_600 * 1_000_000
_EPOCH = dt.date(1970, 1, 1)


def transform_values(column: pa.Array | pa.ChunkedArray, transform: str) -> list[Any]:
    """Iceberg's ``transform`` of ``column`` as Python values (``None`` for nulls).

    Year, month, day and hour count from the Unix epoch (Iceberg's definition); floor
    division keeps times before 1970 in the right bucket.
    """
    if transform == "identity":
        return list(column.to_pylist())
    t = column.type
    if transform in ("year", "month"):
        years = pc.subtract(pc.year(column), 1970)
        if transform == "year":
            return list(years.to_pylist())
        return list(pc.add(pc.multiply(years, 12), pc.subtract(pc.month(column), 1)).to_pylist())
    if pa.types.is_date(t):
        days = pc.cast(pc.cast(column, pa.date32()), pa.int32())
        return list(days.to_pylist())
    micros = pc.cast(column, pa.int64())
    raw = np.asarray(pc.fill_null(micros, 0), dtype=np.int64)
    raw = raw // 1_000 if t.unit == "ns" else raw * _US[t.unit]
    unit = 86_400 * 1_000_000 if transform == "day" else _HOUR_US
    buckets = (raw // unit).tolist()
    nulls = micros.is_null().to_pylist()
    return [None if n else b for b, n in zip(buckets, nulls, strict=True)]


def human_value(transform: str, value: Any) -> str:
    """A partition value as Iceberg prints it in paths (``2024-05-01``, ``2024-05`` ...)."""
    if value is None:
        return "null"
    if transform == "year":
        return f"{1970 + value:04d}"
    if transform == "month":
        return f"{1970 + value // 12:04d}-{value % 12 + 1:02d}"
    if transform == "day":
        return (_EPOCH + dt.timedelta(days=value)).isoformat()
    if transform == "hour":
        moment = dt.datetime(1970, 1, 1) + dt.timedelta(hours=value)
        return moment.strftime("%Y-%m-%d-%H")
    return str(value)


class IcebergBatchWriter(BatchWriter):
    """Writes one task's rows of a batch as data files, one writer per Iceberg partition."""

    def __init__(
        self,
        location: sfs.Location,
        schema: pa.Schema,
        fields: Sequence[PartitionField],
        compression: str,
        target_file_size: int,
        file_stem: str,
    ) -> None:
        self._location = location
        self._schema = schema
        self._fields = list(fields)
        self._compression = compression
        self._target = target_file_size
        self._stem = file_stem
        self._writers: dict[tuple[Any, ...], ParquetBatchWriter] = {}
        self._offsets: dict[str, list[int]] = {}
        self._tracks_offsets = {"topic", "partition", "offset"} <= set(schema.names)

    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows (cast to the table's types), split by partition."""
        if batch.num_rows == 0:
            return
        if batch.schema != self._schema:
            # ns -> us timestamps truncate (Iceberg v2 stores microseconds): intended.
            batch = batch.cast(self._schema, safe=False)
        table = pa.Table.from_batches([batch])
        if self._tracks_offsets:
            self._note_offsets(table)
        for key, part in self._split(table):
            writer = self._writers.get(key)
            if writer is None:
                writer = self._open(key)
                self._writers[key] = writer
            for piece in part.to_batches():
                writer.write(piece)

    def _split(self, table: pa.Table) -> list[tuple[tuple[Any, ...], pa.Table]]:
        if not self._fields:
            return [((), table)]
        keys = [transform_values(table.column(f.source), f.transform) for f in self._fields]
        rows: dict[tuple[Any, ...], list[int]] = {}
        for i, key in enumerate(zip(*keys, strict=True)):
            rows.setdefault(key, []).append(i)
        if len(rows) == 1:
            return [(next(iter(rows)), table)]
        return [(key, table.take(pa.array(idx, pa.int64()))) for key, idx in rows.items()]

    def _open(self, key: tuple[Any, ...]) -> ParquetBatchWriter:
        path = "/".join(
            f"{f.name}={urllib.parse.quote(human_value(f.transform, v), safe='-_.')}"
            for f, v in zip(self._fields, key, strict=True)
        )
        # One writer per partition, with a distinct stem: names never collide across them.
        stem = f"{self._stem}-{len(self._writers):04d}"
        return ParquetBatchWriter(
            self._location,
            self._schema,
            (),
            self._compression,
            self._target,
            prefix="/".join(p for p in ("data", path) if p),
            file_stem=stem,
        )

    def _note_offsets(self, table: pa.Table) -> None:
        grouped = (
            table.select(["topic", "partition", "offset"])
            .group_by(["topic", "partition"], use_threads=False)
            .aggregate([("offset", "min"), ("offset", "max")])
        )
        for row in grouped.to_pylist():
            name = f"{row['topic']}/{row['partition']}"
            lo, hi = row["offset_min"], row["offset_max"]
            if lo is None:
                continue
            seen = self._offsets.get(name)
            self._offsets[name] = [lo, hi] if seen is None else [min(seen[0], lo), max(seen[1], hi)]

    def close(self) -> list[WrittenFile]:
        """Finish the files; they stay invisible until the driver commits them."""
        stats = json.dumps({OFFSETS_KEY: self._offsets}) if self._offsets else None
        files: list[WrittenFile] = []
        for writer in self._writers.values():
            for f in writer.close():
                files.append(
                    WrittenFile(f.path, f.rows, f.size_bytes, f.partition_values, stats, f.digest)
                )
        self._writers.clear()
        return files

    def abort(self) -> None:
        """Delete this writer's files."""
        for writer in self._writers.values():
            writer.abort()
        self._writers.clear()


def merge_offsets(files: Sequence[WrittenFile]) -> dict[str, list[int]]:
    """The offset ranges of all files' writers, merged per topic-partition."""
    out: dict[str, list[int]] = {}
    for f in files:
        if not f.stats:
            continue
        for name, (lo, hi) in json.loads(f.stats).get(OFFSETS_KEY, {}).items():
            seen = out.get(name)
            out[name] = [lo, hi] if seen is None else [min(seen[0], lo), max(seen[1], hi)]
    return dict(sorted(out.items()))
