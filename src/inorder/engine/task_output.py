"""A task's output writer, shared by every topic-partition the task applies.

Output rows carry their ``topic``, ``partition`` and ``offset``, so nothing needs a file to
hold one topic-partition: the task hands every partition's encoded rows to one
:class:`~inorder.sinks.base.BatchWriter`, which keeps one open file per output partition
(per topic when the output is partitioned by topic, the documented layout). A task applying
four partitions of a topic stages one file for that topic instead of four; the fixed costs
of a file (open, footer, close, publish at commit, its staging directory) are paid per
output partition per task, not per topic-partition.

Small batches of encoded rows (under :data:`GATHER_BELOW_ROWS`) are gathered and handed to
the writer together (at least :data:`COALESCE_ROWS` rows or :data:`COALESCE_BYTES` bytes at
a time, and at close): a task of hundreds of topic-partitions with a few rows each would
otherwise pay the writer's per-call work (splitting rows by output partition, deriving the
topic bucket) once per topic-partition. Larger batches go to the writer as they come.

Exactly-once is unchanged: the writer stages under a key unique to the task attempt, the
driver commits the reported files once per batch, and a task with a failed partition
deletes what it staged (the driver fails the batch, which is run again whole).
"""

from __future__ import annotations

import time
import uuid

import pyarrow as pa

from inorder.engine.violations import DeadLetter
from inorder.records import BATCH_ID_FIELD, ORIGIN_FIELDS, TopicPartition
from inorder.sinks.base import BatchWriter, Sink, WrittenFile

#: Batches of fewer rows are gathered; larger ones go to the writer as they come.
GATHER_BELOW_ROWS = 1_024
#: Rows gathered before they are handed to the writer in one call.
COALESCE_ROWS = 65_536
#: Arrow bytes gathered before they are handed to the writer in one call.
COALESCE_BYTES = 32 * 1024 * 1024

#: Schema of dead-letter rows.
DEAD_LETTER_SCHEMA = pa.schema(
    [
        *ORIGIN_FIELDS,
        pa.field("kafka_key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("state_key", pa.string()),
        pa.field("rule", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        BATCH_ID_FIELD,
    ]
)


class TaskOutput:
    """The staged output of one task attempt: one writer for all its topic-partitions."""

    def __init__(self, sink: Sink, schema: pa.Schema, batch_id: int) -> None:
        self.sink = sink
        self.schema = schema
        self.batch_id = batch_id
        #: Unique per task attempt: a retried or speculative attempt stages elsewhere.
        self.key = f"task-{uuid.uuid4().hex[:12]}"
        self.writer: BatchWriter | None = None
        #: Seconds spent closing the writer (writing the last row groups and footers).
        self.close_seconds = 0.0
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Add encoded rows of any of the task's topic-partitions (the writer opens lazily)."""
        if batch.num_rows == 0:
            return
        if batch.num_rows >= GATHER_BELOW_ROWS:
            # Large enough to pay the writer's per-call work alone: gathering it would only
            # copy it. What was gathered goes first, to keep the order rows came in.
            self._hand_over()
            self._writer().write(batch)
            return
        self.gather(batch)

    def gather(self, batch: pa.RecordBatch) -> None:
        """Add encoded rows to those handed to the writer together, whatever their number
        (the task's partitions' last rows encoded together come this way)."""
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._pending_bytes += batch.nbytes
        if self._pending_rows >= COALESCE_ROWS or self._pending_bytes >= COALESCE_BYTES:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the gathered rows to the writer in one call, in the order they came."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._pending_rows = self._pending_bytes = 0
        writer = self._writer()
        if len(pending) == 1:
            writer.write(pending[0])
            return
        combined = pa.Table.from_batches(pending).combine_chunks()
        for batch in combined.to_batches():
            writer.write(batch)

    def _writer(self) -> BatchWriter:
        if self.writer is None:
            self.writer = self.sink.open_writer(self.schema, self.batch_id, self.key)
        return self.writer

    def close(self) -> list[WrittenFile]:
        """Finish the staged files; what the task reports for the driver to commit."""
        started = time.perf_counter()
        self._hand_over()
        if self.writer is None:
            return []
        try:
            return self.writer.close()
        finally:
            self.writer = None
            self.close_seconds = time.perf_counter() - started

    def abort(self) -> None:
        """Delete whatever this attempt staged (a partition of the task failed)."""
        self._pending = []
        self._pending_rows = self._pending_bytes = 0
        if self.writer is not None:
            self.writer.abort()
            self.writer = None


def write_dead_letters(
    sink: Sink, batch_id: int, tp: TopicPartition, task_key: str, letters: list[DeadLetter]
) -> list[WrittenFile]:
    """Stage one topic-partition's dead letters (records that broke a rule, with the reason)."""
    n = len(letters)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([tp.topic] * n, pa.string()),
            pa.array([tp.partition] * n, pa.int32()),
            pa.array([d.offset for d in letters], pa.int64()),
            pa.array([d.kafka_key for d in letters], pa.binary()),
            pa.array([d.value for d in letters], pa.binary()),
            pa.array([d.timestamp_us for d in letters], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            pa.array([d.key for d in letters], pa.string()),
            pa.array([d.rule for d in letters], pa.string()),
            pa.array([d.detail for d in letters], pa.string()),
            pa.array([batch_id] * n, pa.int64()),
        ],
        schema=DEAD_LETTER_SCHEMA,
    )
    writer = sink.open_writer(DEAD_LETTER_SCHEMA, batch_id, f"dl-{task_key}")
    writer.write(batch)
    return writer.close()


__all__ = ["DEAD_LETTER_SCHEMA", "TaskOutput", "write_dead_letters"]
