"""The raw archive: every consumed Kafka record, exactly once, in a partitioned Parquet dataset.

``Archive(source=KafkaSource(...), path=..., checkpoint=...)`` is a companion pipeline with no
processor. Each micro-batch is ``source -> foreachBatch``; inside it one Spark action maps the
source's Arrow batches straight to the sink's writer (``mapInArrow``: one task per
topic-partition range, no shuffle), and the driver then writes the batch's offset index and
commits the sink (:class:`~inorder.sinks.parquet.ParquetSink`: executors stage, driver
commits, idempotent per batch id). A batch re-run after a crash plans the same offsets,
rewrites the same index and commits at most once, so every record lands exactly once.

The source reads ``read_committed`` with headers and partition markers: markers tell each
task its planned range even when it ends in offsets that are not records, which is what
makes the seam of :mod:`inorder.archive.tiered_source` exact.
"""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.archive.layout import ARCHIVE_SCHEMA, PARTITION_BY, ArchivedRange, write_index
from inorder.checkpoint.layout import CheckpointLayout
from inorder.ddl import arrow_ddl
from inorder.engine.task import INPUT_EXPRS
from inorder.errors import ConfigError, InorderError
from inorder.kafka.markers import marker_rows
from inorder.pipeline.query import checkpoint_owner, trigger_kwargs
from inorder.sinks.base import Sink, SinkError, WrittenFile
from inorder.sinks.parquet import ParquetSink

if TYPE_CHECKING:
    from inorder.kafka.api import KafkaSource

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


@dataclass
class ArchiveSummary:
    """The result of :meth:`Archive.run`."""

    batches: int = 0
    records: int = 0
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class Archive:
    """A companion pipeline landing every Kafka record of ``source`` in ``path``, exactly once.

    ``path`` is a local path or ``s3://bucket/prefix``; ``checkpoint`` holds Spark's offsets
    (one checkpoint per archive). ``trigger`` is an interval, ``"available-now"`` or
    ``"once"``, as for pipelines. Records are stored with topic, partition, offset,
    timestamp, timestamp type, key, value and headers, partitioned by topic, date (UTC, of
    the record timestamp) and partition, zstd-compressed, files up to ``target_file_size``.
    """

    source: KafkaSource
    path: str
    checkpoint: str | Path
    trigger: str = "1 minute"
    storage_options: Mapping[str, str] | None = None
    compression: str = "zstd"
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    name: str = "inorder-archive"
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    on_batch: Any = None
    """Optional callable receiving each :class:`ArchiveBatchReport` (progress)."""

    def sink(self) -> ParquetSink:
        """The archive's sink."""
        return archive_sink(
            self.path, self.storage_options, self.compression, self.target_file_size
        )

    def source_options(self) -> dict[str, str]:
        """Options forced on the source: everything the archive needs to be exact."""
        return {
            "includeHeaders": "true",
            "inorder.partitionMarkers": "true",
            "failOnDataLoss": "true",
            "kafka.isolation.level": "read_committed",
        }

    def run(self, stop_after_batches: int | None = None) -> ArchiveSummary:
        """Run until the trigger ends (available-now/once), a stop, or ``stop_after_batches``."""
        from inorder.pipeline.spark import build_spark_session

        if self.source.reads_archive:
            raise ConfigError("archive: the archive's source must read Kafka, not an archive")
        started = time.monotonic()
        trigger = trigger_kwargs(self.trigger)
        owner = checkpoint_owner(str(self.checkpoint))
        extra = self.source_options()
        # A trigger that ends with a pattern matching nothing would archive nothing: refused.
        self.source.check(extra, bounded="processingTime" not in trigger)
        sink = self.sink()
        sink.bind(owner)
        try:
            sink.check(ARCHIVE_SCHEMA)
        except SinkError as exc:
            raise ConfigError(f"archive: {exc}") from None
        spark = build_spark_session(
            master=self.spark_master, app_name=self.name, conf=dict(self.spark_conf)
        )
        df = self.source.load(spark, extra_options=extra)
        summary = ArchiveSummary()
        failure: list[BaseException] = []
        stop = threading.Event()
        lock = threading.Lock()

        def on_batch(batch_df: Any, batch_id: int) -> None:
            if stop.is_set():
                raise _Stop()
            with lock:
                try:
                    report = run_archive_batch(sink, batch_df, batch_id)
                except BaseException as exc:
                    failure.append(exc)
                    raise
                summary.batches += 1
                summary.records += report.records
                summary.files += report.files
                summary.bytes += report.bytes
                if self.on_batch is not None:
                    self.on_batch(report)
                if stop_after_batches is not None and summary.batches >= stop_after_batches:
                    stop.set()

        query = (
            df.writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", CheckpointLayout.of(self.checkpoint).spark_dir)
            .queryName(self.name)
            .trigger(**trigger)
            .start()
        )
        try:
            while query.isActive:
                try:
                    query.awaitTermination(0.5)
                except Exception:
                    break
                if stop.is_set() and query.isActive:
                    with lock:
                        spark.sparkContext.setLogLevel("OFF")
                        query.stop()
        except KeyboardInterrupt:
            with lock:
                query.stop()
        summary.seconds = time.monotonic() - started
        real = [f for f in failure if not isinstance(f, _Stop)]
        if real:
            first = real[0]
            if isinstance(first, InorderError):
                raise first
            raise InorderError(f"archive batch failed: {type(first).__name__}: {first}")
        if not stop.is_set():
            err = query.exception()
            if err is not None:
                lines = str(err).strip().splitlines()
                raise InorderError(f"archive query failed: {lines[0] if lines else err!r}")
        return summary


class _Stop(Exception):
    """Raised inside foreachBatch to end the query before a batch does any work."""
