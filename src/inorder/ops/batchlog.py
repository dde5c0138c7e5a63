"""The batch history of a pipeline, read from its checkpoint (never written here): the ops
tools' view of Spark's logs (read by :class:`~inorder.checkpoint.spark_log.SparkLog`, local
or S3) joined with the engine's batch times.

* ``<checkpoint>/spark/offsets/<batch_id>`` and ``<checkpoint>/spark/commits/<batch_id>``:
  which offsets each micro-batch covered, when it was planned and when it ended.
* ``<checkpoint>/engine/batches/<batch_id:020d>.json``: the batch's processing time (fixed
  at its first run; processing-time timeouts fire against it); older records are merged
  into ``batches/upto-<batch_id:020d>.parquet`` (:meth:`CheckpointStore.batch_times` reads
  both).

Spark keeps only the newest ``spark.sql.streaming.minBatchesToRetain`` (default 100) entries
of its logs; :attr:`BatchLog.complete` says whether the log still starts at batch 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.spark_log import SparkBatch, SparkLog
from inorder.records import TopicPartition
from inorder.state.checkpoint import CheckpointStore


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One micro-batch of Spark's logs, as :class:`SparkLog` read it, with the processing time
    the engine fixed for it (``None`` when the engine's batch times were not read)."""

    spark: SparkBatch
    processing_time_us: int | None = None

    @property
    def batch_id(self) -> int:
        """The micro-batch's id."""
        return self.spark.batch_id

    @property
    def end(self) -> dict[TopicPartition, int]:
        """Per topic-partition, the next offset to read after the batch."""
        return self.spark.end

    @property
    def starts(self) -> dict[TopicPartition, int]:
        """Where partitions read for the first time in this batch began (the source records
        it)."""
        return self.spark.starts

    @property
    def committed(self) -> bool:
        """Whether Spark's commits log has the batch."""
        return self.spark.committed

    @property
    def planned_at(self) -> float | None:
        """When Spark planned the batch (its offsets entry's time)."""
        return self.spark.planned_at

    @property
    def committed_at(self) -> float | None:
        """When the batch ended (its commits entry's time)."""
        return self.spark.committed_at

    @property
    def duration_seconds(self) -> float | None:
        """Wall time from planning to Spark's commit (``None`` when not committed)."""
        if self.planned_at is None or self.committed_at is None:
            return None
        return max(0.0, self.committed_at - self.planned_at)


@dataclass(frozen=True, slots=True)
class Segment:
    """The part of one micro-batch that belongs to one topic-partition: offsets ``[start, end)``.

    ``start`` is ``None`` for the first batch a partition took part in (it started wherever
    the query's starting offsets put it, which the log does not record).
    """

    batch_id: int
    start: int | None
    end: int
    processing_time_us: int | None


@dataclass
class BatchLog:
    """The batches recorded in a checkpoint, oldest first."""

    batches: list[BatchEntry] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether the log still holds every batch since the query started."""
        return bool(self.batches) and self.batches[0].batch_id == 0

    def last_committed(self) -> BatchEntry | None:
        """The newest batch Spark recorded as committed."""
        done = [b for b in self.batches if b.committed]
        return done[-1] if done else None

    def get(self, batch_id: int) -> BatchEntry | None:
        """The entry of ``batch_id``, if still in the log."""
        for b in self.batches:
            if b.batch_id == batch_id:
                return b
        return None

    def partitions(self) -> list[TopicPartition]:
        """Every topic-partition any logged batch covered."""
        return sorted({tp for b in self.batches for tp in b.end})

    def start_of(self, batch_id: int) -> dict[TopicPartition, int]:
        """Where ``batch_id`` started per partition (the previous batch's end)."""
        previous: dict[TopicPartition, int] = {}
        for b in self.batches:
            if b.batch_id >= batch_id:
                break
            previous = b.end
        return dict(previous)

    def segments(self, tp: TopicPartition, upto_batch: int | None = None) -> list[Segment]:
        """The batches ``tp`` took part in, with their offset ranges, up to ``upto_batch``."""
        out: list[Segment] = []
        previous: int | None = None
        for b in self.batches:
            if upto_batch is not None and b.batch_id > upto_batch:
                break
            end = b.end.get(tp)
            if end is None:
                continue
            out.append(Segment(b.batch_id, previous, end, b.processing_time_us))
            previous = end
        return out


def load_batch_log(
    checkpoint: CheckpointLayout | str, engine: CheckpointStore | None = None
) -> BatchLog:
    """Spark's offsets and commits logs (:class:`~inorder.checkpoint.spark_log.SparkLog`, local
    or S3) with the engine's batch times.

    ``checkpoint`` is the checkpoint's layout; a string names a Spark checkpoint directory
    (the form of earlier releases).
    """
    spark = (
        checkpoint.spark_log
        if isinstance(checkpoint, CheckpointLayout)
        else SparkLog.at(checkpoint)
    )
    batches = spark.batches()
    times = engine.batch_times([b.batch_id for b in batches]) if engine is not None else {}
    return BatchLog([BatchEntry(b, times.get(b.batch_id)) for b in batches])
