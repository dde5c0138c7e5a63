"""What a task sends to the driver: one typed :class:`TaskResult` per topic-partition.

A task (partition backend) or key group (spark backend) applies its records, stages output
files and state, and returns one small result: the offsets it consumed, counters, violations,
and every staged file complete with its statistics (Delta keeps them as per-file min/max).
The result travels through Spark as one row of :data:`RESULT_SCHEMA`: where it comes from
(``topic``, ``partition``, readable in Spark's UI and plans) and the result itself, encoded
with msgspec. Nothing else crosses the boundary, so a field added here reaches the driver
without a schema or DDL string to keep in step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import pyarrow as pa

from inorder.ddl import arrow_ddl
from inorder.engine.violations import PROCESSOR_ERROR, ViolationEvent
from inorder.sinks.base import WrittenFile


class ResultFile(msgspec.Struct, frozen=True, gc=False):
    """A staged file as the driver needs it to commit (a :class:`WrittenFile`, complete)."""

    path: str
    rows: int
    size_bytes: int
    partition_values: dict[str, str | None] = {}
    stats: str | None = None
    digest: str | None = None

    @classmethod
    def of(cls, written: WrittenFile) -> ResultFile:
        """The result form of a file a writer staged."""
        return cls(
            written.path,
            written.rows,
            written.size_bytes,
            dict(written.partition_values),
            written.stats,
            written.digest,
        )

    def written(self) -> WrittenFile:
        """Back to the sink's descriptor."""
        return WrittenFile(
            self.path,
            self.rows,
            self.size_bytes,
            dict(self.partition_values),
            self.stats,
            self.digest,
        )


class TaskResult(msgspec.Struct, kw_only=True):
    """One topic-partition's (or key group's) part of a micro-batch."""

    topic: str
    partition: int
    first_offset: int | None = None
    """First offset applied in this batch (``None``: none)."""
    last_offset: int = -1
    """Last offset consumed, this batch included."""
    records: int = 0
    output_rows: int = 0
    files: list[ResultFile] = []
    dead_letter_files: list[ResultFile] = []
    state_keys: int = 0
    violations: list[ViolationEvent] = []
    """The first events (bounded per partition); :attr:`violation_counts` is exact."""
    violation_counts: dict[str, int] = {}
    counters: dict[str, int] = {}
    timings: dict[str, float] = {}
    failed: ViolationEvent | None = None
    """The event that stopped the partition (``fail`` policy or a bug), if any."""
    worker: str = ""
    """The process that ran the task (``host:pid``): whether a partition stayed in its worker."""
    planned: list[int] | None = None
    """``[start, end]``: the offsets ``[start, end)`` the task was given for this partition by
    its marker rows (``None``: not known, records came as rows)."""

    def written_files(self) -> list[WrittenFile]:
        """Staged output files."""
        return [f.written() for f in self.files]

    def written_dead_letter_files(self) -> list[WrittenFile]:
        """Staged dead-letter files."""
        return [f.written() for f in self.dead_letter_files]


#: The row a result travels in through Spark.
RESULT_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int64()),
        pa.field("result", pa.binary()),
    ]
)
#: :data:`RESULT_SCHEMA` as Spark DDL (for ``mapInArrow``).
RESULT_DDL = arrow_ddl(RESULT_SCHEMA)

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(TaskResult).decode


def result_row(result: TaskResult) -> dict[str, Any]:
    """The row of :data:`RESULT_SCHEMA` carrying ``result``."""
    return {"topic": result.topic, "partition": result.partition, "result": _encode(result)}


def result_of(row: Mapping[str, Any]) -> TaskResult:
    """The result a row of :data:`RESULT_SCHEMA` carries."""
    return _decode(row["result"])


def failure_result(topic: str, partition: int, detail: str) -> TaskResult:
    """The result of a task that failed outside the apply loop (a bug, reported in one line)."""
    event = ViolationEvent(topic, partition, -1, None, PROCESSOR_ERROR, detail, "fail")
    return TaskResult(
        topic=topic,
        partition=partition,
        violations=[event],
        violation_counts={PROCESSOR_ERROR: 1},
        failed=event,
    )


def merge_results(results: Iterable[TaskResult]) -> list[TaskResult]:
    """Fold several results of one topic-partition (its key groups) into one, per partition."""
    by_tp: dict[tuple[str, int], list[TaskResult]] = {}
    for r in results:
        by_tp.setdefault((r.topic, r.partition), []).append(r)
    merged: list[TaskResult] = []
    for (topic, partition), parts in sorted(by_tp.items()):
        firsts = [p.first_offset for p in parts if p.first_offset is not None]
        failed = [p.failed for p in parts if p.failed is not None]
        merged.append(
            TaskResult(
                topic=topic,
                partition=partition,
                first_offset=min(firsts) if firsts else None,
                last_offset=max(p.last_offset for p in parts),
                records=sum(p.records for p in parts),
                output_rows=sum(p.output_rows for p in parts),
                files=[f for p in parts for f in p.files],
                dead_letter_files=[f for p in parts for f in p.dead_letter_files],
                state_keys=sum(p.state_keys for p in parts),
                violations=sorted(
                    (v for p in parts for v in p.violations), key=lambda v: (v.offset, v.rule)
                ),
                violation_counts=_sum(p.violation_counts for p in parts),
                counters=_sum(p.counters for p in parts),
                timings=_sum(p.timings for p in parts),
                failed=min(failed, key=lambda v: v.offset) if failed else None,
                worker=",".join(sorted({p.worker for p in parts})),
            )
        )
    return merged


def _sum(dicts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dicts:
        for name, n in d.items():
            out[name] = out.get(name, 0) + n
    return out
