"""A streaming source that replays given micro-batches (tests and benchmarks of the Spark backend).

The Spark backend runs only inside a streaming query, so driving it with chosen batch
boundaries needs a streaming source. :class:`ReplayDataSource` (format ``inorder-replay``,
option ``path``) reads ``<path>/batch-NNNNN.arrow`` files (Kafka-shaped Arrow tables written
by :func:`write_batch`) and ``<path>/partitions.json`` (the topic-partitions to plan). Its
offset is the number of consecutive batch files present, so a test releases micro-batch ``i``
by writing its file: each trigger then covers exactly the newly released batches, and a
restarted query re-reads a batch from the same file. Every planned topic-partition gets one
input partition starting with a marker row, like the Kafka source's
``inorder.partitionMarkers``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from inorder.kafka.consumer import SOURCE_ARROW_SCHEMA
from inorder.records import KAFKA_ARROW_SCHEMA, KAFKA_SPARK_DDL, KafkaRecord, TopicPartition
from inorder.testing.memory import partition_table

FORMAT = "inorder-replay"
_PARTITIONS_FILE = "partitions.json"


def _batch_file(root: Path, index: int) -> Path:
    return root / f"batch-{index:05d}.arrow"


def write_partitions(path: str | Path, tps: Sequence[TopicPartition]) -> None:
    """Declare the topic-partitions every micro-batch plans (before the query starts)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    doc = [[tp.topic, tp.partition] for tp in sorted(tps)]
    (root / _PARTITIONS_FILE).write_text(json.dumps(doc))


def write_batch(path: str | Path, index: int, records: Iterable[KafkaRecord]) -> None:
    """Release micro-batch ``index`` (its records in arrival order, any topic-partitions)."""
    rows = list(records)
    tps = sorted({(r.topic, r.partition) for r in rows})
    table = (
        pa.Table.from_batches(
            [b for tp in tps for b in _records_table(rows, tp)], schema=KAFKA_ARROW_SCHEMA
        )
        if rows
        else KAFKA_ARROW_SCHEMA.empty_table()
    )
    write_table(path, index, table)


def write_table(path: str | Path, index: int, table: pa.Table) -> None:
    """Release micro-batch ``index`` given as a Kafka-shaped Arrow table (no marker rows)."""
    root = Path(path)
    tmp = _batch_file(root, index).with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, KAFKA_ARROW_SCHEMA) as writer:
        writer.write_table(table.cast(KAFKA_ARROW_SCHEMA))
    os.replace(tmp, _batch_file(root, index))


def _records_table(rows: list[KafkaRecord], tp: tuple[str, int]) -> list[pa.RecordBatch]:
    own = [r for r in rows if (r.topic, r.partition) == tp]
    table = partition_table(TopicPartition(*tp), own).slice(1)  # without the marker row
    batches: list[pa.RecordBatch] = table.to_batches()
    return batches


def _available(root: Path) -> int:
    n = 0
    while _batch_file(root, n).exists():
        n += 1
    return n


class ReplayDataSource(DataSource):
    """``spark.readStream.format("inorder-replay").option("path", dir).load()``."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def schema(self) -> str:
        """The Kafka source's schema."""
        return KAFKA_SPARK_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        """The reader over ``path``."""
        return ReplayStreamReader(str(dict(self.options)["path"]))


class ReplayStreamReader(DataSourceStreamReader):
    """Offsets ``{"batches": n}``: the first ``n`` batch files."""

    def __init__(self, path: str) -> None:
        self.path = path

    def initialOffset(self) -> dict[str, int]:
        """Before the first batch."""
        return {"batches": 0}

    def latestOffset(self) -> dict[str, int]:  # type: ignore[override]
        """The batch files released so far."""
        return {"batches": _available(Path(self.path))}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        """One input partition per declared topic-partition."""
        doc = json.loads((Path(self.path) / _PARTITIONS_FILE).read_text())
        first, last = int(start["batches"]), int(end["batches"])
        return [InputPartition((str(t), int(p), first, last)) for t, p in doc]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The marker row, then the partition's records of the batches in range."""
        topic, part, first, last = partition.value
        tables: list[pa.Table] = []
        for index in range(first, last):
            with pa.memory_map(str(_batch_file(Path(self.path), index))) as source:
                table = ipc.open_file(source).read_all()
            mask = pc.and_(
                pc.equal(table.column("topic"), topic),
                pc.equal(table.column("partition"), part),
            )
            tables.append(table.filter(mask))
        records = pa.concat_tables(tables) if tables else KAFKA_ARROW_SCHEMA.empty_table()
        start = records.column("offset")[0].as_py() if records.num_rows else 0
        marker = partition_table(TopicPartition(topic, part), [], start=start)
        both = pa.concat_tables([marker, records]).cast(SOURCE_ARROW_SCHEMA)
        yield from both.combine_chunks().to_batches(max_chunksize=65_536)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release."""


class ReplayRun:
    """A streaming query of a Spark backend over a replay source, one released batch at a time.

    :meth:`step` releases the next micro-batch and waits until the query has processed it;
    it returns the backend's report or raises the error ``run_batch`` raised. ``crash_after``
    makes the next batch run its tasks and then fail before committing (a crash); the next
    :meth:`step` restarts the query, which re-runs that batch.
    """

    def __init__(self, spark: Any, backend: Any, root: str | Path, tps: Sequence[TopicPartition]):
        self.spark = spark
        self.backend = backend
        self.root = Path(root)
        self.source = self.root / "source"
        write_partitions(self.source, tps)
        self.released = _available(self.source)
        self.reports: dict[int, Any] = {}
        self.errors: dict[int, BaseException] = {}
        self.crash_batch: int | None = None
        self._query: Any = None
        spark.dataSource.register(ReplayDataSource)

    def _on_batch(self, df: Any, batch_id: int) -> None:
        if batch_id == self.crash_batch:
            self.crash_batch = None
            self.backend.run_tasks(df, batch_id)
            raise _Crash(f"crash after the tasks of batch {batch_id}")
        try:
            self.reports[batch_id] = self.backend.run_batch(df, batch_id)
        except BaseException as exc:
            self.errors[batch_id] = exc
            raise

    def _start(self) -> None:
        stream = self.spark.readStream.format(FORMAT).option("path", str(self.source)).load()
        self._query = (
            self.backend.prepare_stream(stream)
            .writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", str(self.root / "spark-checkpoint"))
            .start()
        )

    def step(self, records: Iterable[KafkaRecord] | pa.Table) -> Any:
        """Release one micro-batch; its report (or the error its batch raised)."""
        batch_id = self.released
        if isinstance(records, pa.Table):
            write_table(self.source, batch_id, records)
        else:
            write_batch(self.source, batch_id, records)
        self.released += 1
        for _ in range(3):
            if self._query is None or not self._query.isActive:
                self._start()
            with contextlib.suppress(Exception):  # a failed query: reported below
                self._query.processAllAvailable()
            if batch_id in self.errors:
                self.stop()
                raise self.errors[batch_id]
            if batch_id in self.reports:
                return self.reports[batch_id]
        raise RuntimeError(f"micro-batch {batch_id} did not run: {self._failure()}")

    def _failure(self) -> str:
        exc = None if self._query is None else self._query.exception()
        return "no error" if exc is None else str(exc).splitlines()[0]

    def stop(self) -> None:
        """Stop the query (between triggers)."""
        if self._query is not None and self._query.isActive:
            self._query.stop()
        self._query = None


class _Crash(Exception):
    """A simulated crash between a batch's tasks and its commit."""
