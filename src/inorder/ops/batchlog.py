"""The batch history of a pipeline, read from its checkpoint (never written here).

* ``<checkpoint>/spark/offsets/<batch_id>``: written by Spark when it plans a micro-batch;
  the last line is the source's end offset (:class:`~inorder.kafka.offsets.SourceOffset`):
  per topic-partition, the next offset to read after the batch. Its mtime is when the batch
  was planned.
* ``<checkpoint>/spark/commits/<batch_id>``: written when the batch finished; its mtime is
  when it ended.
* ``<checkpoint>/engine/batches/<batch_id:020d>.json``: the batch's processing time (fixed
  at its first run; processing-time timeouts fire against it); older records are merged
  into ``batches/upto-<batch_id:020d>.parquet`` (:meth:`CheckpointStore.batch_times` reads
  both).

Spark keeps only the newest ``spark.sql.streaming.minBatchesToRetain`` (default 100) entries
of its logs; :attr:`BatchLog.complete` says whether the log still starts at batch 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from inorder.kafka.offsets import SourceOffset
from inorder.records import TopicPartition
from inorder.state.checkpoint import CheckpointStore


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One micro-batch of the Spark offsets log."""

    batch_id: int
    end: dict[TopicPartition, int]
    committed: bool
    planned_at: float | None
    committed_at: float | None
    processing_time_us: int | None
    starts: dict[TopicPartition, int] = field(default_factory=dict)
    """Where partitions read for the first time in this batch began (the source records it)."""

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


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def _ids(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def read_offsets_file(path: str) -> SourceOffset | None:
    """The source offset on the last line of a Spark offsets log file (``None``: unreadable)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line.strip() for line in handle if line.strip()]
    except OSError:
        return None
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or "offsets" not in data:
        return None
    return SourceOffset.from_dict(data)


def load_batch_log(spark_dir: str, engine: CheckpointStore | None = None) -> BatchLog:
    """Read the Spark offsets/commits logs (local directory) and the engine's batch times."""
    root = spark_dir.removeprefix("file://")
    offsets_dir = os.path.join(root, "offsets")
    commits_dir = os.path.join(root, "commits")
    committed = set(_ids(commits_dir))
    log = BatchLog()
    offset_ids = _ids(offsets_dir)
    times = engine.batch_times(offset_ids) if engine is not None else {}
    for batch_id in offset_ids:
        path = os.path.join(offsets_dir, str(batch_id))
        offset = read_offsets_file(path)
        if offset is None:
            continue
        processing = times.get(batch_id)
        log.batches.append(
            BatchEntry(
                batch_id=batch_id,
                end=dict(offset.positions),
                committed=batch_id in committed,
                planned_at=_mtime(path),
                committed_at=_mtime(os.path.join(commits_dir, str(batch_id))),
                processing_time_us=processing,
                starts=dict(offset.starts),
            )
        )
    return log
