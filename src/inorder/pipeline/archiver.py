"""The raw archive's job: every consumed Kafka record, exactly once, in a Parquet dataset.

``Archive(source=KafkaSource(...), path=..., checkpoint=...)`` is a companion pipeline with no
processor. Each micro-batch is ``source -> foreachBatch``, and the batch's work is
:func:`inorder.archive.writer.run_archive_batch` (stage on executors, commit once). This
module runs the streaming query around it, beside the pipelines' runner: it builds the
SparkSession and the trigger as every inorder query does, so it sits above ``archive/``'s
formats and readers, which never import the runner.

The source reads ``read_committed`` with headers and partition markers (see
:meth:`Archive.source_options`), which is what makes the archive exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inorder.archive.layout import ARCHIVE_SCHEMA
from inorder.archive.writer import (
    DEFAULT_TARGET_FILE_SIZE,
    ArchiveBatchReport,
    archive_sink,
    run_archive_batch,
)
from inorder.checkpoint.layout import CheckpointLayout
from inorder.errors import ConfigError, InorderError
from inorder.pipeline.query import checkpoint_owner, trigger_kwargs
from inorder.sinks.base import SinkError
from inorder.sinks.parquet import ParquetSink

if TYPE_CHECKING:
    from inorder.kafka.api import KafkaSource

__all__ = ["Archive", "ArchiveBatchReport", "ArchiveSummary"]


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
    (one checkpoint per archive): its path, or its layout where the caller built one.
    ``trigger`` is an interval, ``"available-now"`` or ``"once"``, as for pipelines. Records
    are stored with topic, partition, offset, timestamp, timestamp type, key, value and
    headers, partitioned by topic, date (UTC, of the record timestamp) and partition,
    zstd-compressed, files up to ``target_file_size``.
    """

    source: KafkaSource
    path: str
    checkpoint: str | Path | CheckpointLayout
    trigger: str = "1 minute"
    storage_options: Mapping[str, str] | None = None
    compression: str = "zstd"
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    name: str = "inorder-archive"
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    on_batch: Any = None
    """Optional callable receiving each :class:`ArchiveBatchReport` (progress)."""

    @property
    def layout(self) -> CheckpointLayout:
        """The checkpoint's layout: the one handed in, else built from the path."""
        if isinstance(self.checkpoint, CheckpointLayout):
            return self.checkpoint
        return CheckpointLayout.of(self.checkpoint)

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
        layout = self.layout
        owner = checkpoint_owner(layout)
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
            .option("checkpointLocation", layout.spark_dir)
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
