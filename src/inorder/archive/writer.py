"""One micro-batch of the raw archive: source rows staged as archive rows, committed once.

Inside the archive job's ``foreachBatch`` (:mod:`inorder.pipeline.archiver` runs the job), one
Spark action maps the source's Arrow batches straight to the sink's writer (``mapInArrow``: one
task per topic-partition range, no shuffle), and the driver then writes the batch's offset
index and commits the sink (:class:`~inorder.sinks.parquet.ParquetSink`: executors stage,
driver commits, idempotent per batch id). A batch re-run after a crash plans the same offsets,
rewrites the same index and commits at most once, so every record lands exactly once.

The source reads with partition markers: markers tell each task its planned range even when
it ends in offsets that are not records, which is what makes the seam of
:mod:`inorder.archive.tiered_source` exact.
"""

from __future__ import annotations

import base64
import functools
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.archive.layout import ARCHIVE_SCHEMA, PARTITION_BY, ArchivedRange, write_index
from inorder.ddl import arrow_ddl
from inorder.engine.task import INPUT_EXPRS
from inorder.errors import InorderError
from inorder.kafka.markers import marker_rows
from inorder.sinks.base import Sink, WrittenFile
from inorder.sinks.parquet import ParquetSink

#: Archive files are rolled at this size: few, large files (the sink's default is 128 MiB).
DEFAULT_TARGET_FILE_SIZE = 512 * 1024 * 1024

_RESULT_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("records", pa.int64()),
        ("min_ts_us", pa.int64()),
        ("max_ts_us", pa.int64()),
        ("files", pa.string()),
    ]
)
_RESULT_DDL = arrow_ddl(_RESULT_SCHEMA)
_HEADERS_TYPE = ARCHIVE_SCHEMA.field("headers").type


def _headers(text: str | None) -> list[dict[str, Any]] | None:
    if text is None:
        return None
    return [
        {
            "key": h.get("key"),
            "value": None if h.get("value") is None else base64.b64decode(h["value"]),
        }
        for h in json.loads(text)
    ]


def _json_headers(batch: pa.RecordBatch) -> list[list[tuple[str, bytes | None]] | None]:
    """Per-row headers of the ``headers_json`` column, as ``(key, value)`` pairs."""
    return [
        None if headers is None else [(h["key"], h["value"]) for h in headers]
        for headers in map(_headers, batch.column("headers_json").to_pylist())
    ]


def _marker_range(batch: pa.RecordBatch) -> tuple[pa.Array, tuple[str, int, int, int] | None]:
    """Mask of marker rows and the (topic, partition, start, end) the first one announces."""
    found = marker_rows(batch, _json_headers)
    if not found:  # most batches: no Python list of flags
        return pa.repeat(pa.scalar(False), batch.num_rows), None
    flags = [False] * batch.num_rows
    for i, _, _ in found:
        flags[i] = True
    first, start, end = found[0]
    topic = batch.column("topic")[first].as_py()
    partition = batch.column("partition")[first].as_py()
    return pa.array(flags, pa.bool_()), (str(topic), int(partition), start, end)


def to_archive_batch(data: pa.RecordBatch) -> pa.RecordBatch:
    """Source rows (with ``headers_json``) as archive rows (``ARCHIVE_SCHEMA``)."""
    ts = data.column("timestamp").cast(pa.timestamp("us", tz="UTC"))
    text = data.column("headers_json")
    headers = (
        pa.nulls(data.num_rows, _HEADERS_TYPE)
        if text.null_count == data.num_rows
        else pa.array([_headers(t) for t in text.to_pylist()], _HEADERS_TYPE)
    )
    return pa.RecordBatch.from_arrays(
        [
            data.column("topic").cast(pa.string()),
            data.column("partition").cast(pa.int32()),
            data.column("offset").cast(pa.int64()),
            ts,
            data.column("timestampType").cast(pa.int32()),
            data.column("key").cast(pa.binary()),
            data.column("value").cast(pa.binary()),
            headers,
            pc.cast(ts, pa.date32()),
        ],
        schema=ARCHIVE_SCHEMA,
    )


def _archive_task(
    sink: Sink, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One topic-partition range: stage its records, report the range and the staged files."""
    planned: tuple[str, int, int, int] | None = None
    writer = None
    records = 0
    min_ts: int | None = None
    max_ts: int | None = None
    try:
        for batch in batches:
            mask, found = _marker_range(batch)
            if found is not None and planned is None:
                planned = found
            data = batch.filter(pc.invert(mask)) if found is not None else batch
            if data.num_rows == 0:
                continue
            if planned is None:
                raise InorderError("archive task got records before its range marker")
            rows = to_archive_batch(data)
            if writer is None:
                key = f"{planned[0]}-{planned[1]}-{uuid.uuid4().hex[:12]}"
                writer = sink.open_writer(ARCHIVE_SCHEMA, batch_id, key)
            writer.write(rows)
            records += rows.num_rows
            stamps = rows.column("timestamp").cast(pa.int64())
            if stamps.null_count < len(stamps):
                mm = pc.min_max(stamps)
                lo, hi = mm["min"].as_py(), mm["max"].as_py()
                min_ts = lo if min_ts is None else min(min_ts, lo)
                max_ts = hi if max_ts is None else max(max_ts, hi)
        files = writer.close() if writer is not None else []
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if planned is None:
        return
    yield pa.RecordBatch.from_pylist(
        [
            {
                "topic": planned[0],
                "partition": planned[1],
                "start": planned[2],
                "end": planned[3],
                "records": records,
                "min_ts_us": min_ts,
                "max_ts_us": max_ts,
                "files": json.dumps(
                    [
                        {
                            "path": f.path,
                            "rows": f.rows,
                            "size_bytes": f.size_bytes,
                            "partition_values": f.partition_values,
                        }
                        for f in files
                    ]
                ),
            }
        ],
        schema=_RESULT_SCHEMA,
    )


@dataclass
class ArchiveBatchReport:
    """What one archive micro-batch did."""

    batch_id: int
    committed: bool
    records: int = 0
    files: int = 0
    bytes: int = 0
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0


def archive_sink(
    path: str,
    storage_options: Mapping[str, str] | None = None,
    compression: str = "zstd",
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
) -> ParquetSink:
    """The Parquet sink an archive is written through (never compacted: see coverage)."""
    return ParquetSink(
        path,
        partition_by=list(PARTITION_BY),
        compression=compression,
        target_file_size=target_file_size,
        storage_options=storage_options,
    )


def run_archive_batch(sink: ParquetSink, df: Any, batch_id: int) -> ArchiveBatchReport:
    """Archive one micro-batch (``foreachBatch`` body): stage on executors, commit once."""
    started = time.perf_counter()
    if sink.is_committed(batch_id):
        # Committed before a crash that kept Spark from recording it: nothing to redo.
        return ArchiveBatchReport(batch_id, committed=False)
    task = functools.partial(_archive_task, sink, batch_id)
    rows = [r.asDict() for r in df.selectExpr(*INPUT_EXPRS).mapInArrow(task, _RESULT_DDL).collect()]
    ranges = [ArchivedRange.from_json(r) for r in rows]
    files = [
        WrittenFile(
            path=f["path"],
            rows=int(f["rows"]),
            size_bytes=int(f["size_bytes"]),
            partition_values=dict(f["partition_values"]),
        )
        for r in rows
        for f in json.loads(r["files"])
    ]
    # The index first: it only becomes meaningful when the manifest below is committed.
    write_index(sink.location, batch_id, ranges)
    committed = sink.commit(batch_id, files)
    return ArchiveBatchReport(
        batch_id=batch_id,
        committed=committed,
        records=sum(r.records for r in ranges),
        files=len(files),
        bytes=sum(f.size_bytes for f in files),
        ranges={f"{r.topic}[{r.partition}]": (r.start, r.end) for r in ranges},
        seconds=time.perf_counter() - started,
    )
