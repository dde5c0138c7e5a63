"""What ``inorder repair`` changes: a plan per topic-partition, printed before it is applied."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from inorder.checkpoint.info import CheckpointInfo
from inorder.kafka.offsets import EARLIEST
from inorder.listing import named, topics_and_partitions
from inorder.ops.repair_output import OutputDeletion
from inorder.records import TopicPartition

if TYPE_CHECKING:
    from inorder.sessions.tables_ops import TableRestore

#: Partitions the plan gives a line each (beyond: a line per reason of failure point).
LISTED = 20


@dataclass
class PartitionRepair:
    """The repair of one topic-partition."""

    topic: str
    partition: int
    failure_point: int | None
    """First offset not trusted (``None``: the partition was never consumed)."""
    reason: str
    start: int
    """Where the next run starts (``-2`` earliest, ``-1`` latest for unconsumed partitions)."""
    cut_by: str | None = None
    """The session whose start set ``start``."""
    live_sessions: int = 0
    records_scanned: int = 0
    rows_to_delete: int = 0

    @property
    def tp(self) -> TopicPartition:
        """The topic-partition."""
        return TopicPartition(self.topic, self.partition)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "failure_point": self.failure_point,
            "reason": self.reason,
            "start": self.start,
            "cut_by_session": self.cut_by,
            "live_sessions": self.live_sessions,
            "records_scanned": self.records_scanned,
            "rows_to_delete": self.rows_to_delete,
        }


def partition_line(p: PartitionRepair) -> str:
    """One partition's repair, for humans."""
    name = f"{p.topic}[{p.partition}]"
    if p.failure_point is None:
        where = "earliest" if p.start == EARLIEST else "latest"
        return f"  {name}: never consumed; starts at {where}"
    why = f", back to the start of session {p.cut_by!r}" if p.cut_by is not None else ""
    return (
        f"  {name}: failure point {p.failure_point} ({p.reason}); restart at "
        f"{p.start}{why}; {p.live_sessions} live session(s); delete {p.rows_to_delete:,} "
        "row(s)"
    )


def group_lines(partitions: list[PartitionRepair]) -> list[str]:
    """The partitions' repairs grouped by the reason of their failure point: a line each
    (the first :data:`LISTED` reasons; the rest counted in one more line)."""
    groups: dict[str, list[PartitionRepair]] = {}
    for p in partitions:
        if p.failure_point is None:
            where = "earliest" if p.start == EARLIEST else "latest"
            key = f"never consumed; start at {where}"
        else:
            key = f"failure point: {p.reason}"
        groups.setdefault(key, []).append(p)
    out = []
    for key, members in list(groups.items())[:LISTED]:
        names = [str(p.tp) for p in members]
        text = f"  {topics_and_partitions(names)}: {key}"
        consumed = [p for p in members if p.failure_point is not None]
        if consumed:
            back = [
                p for p in consumed if p.failure_point is not None and p.start < p.failure_point
            ]
            rows = sum(p.rows_to_delete for p in consumed)
            live = sum(p.live_sessions for p in consumed)
            text += (
                f"; {len(back):,} restart before it (at a live session's start), "
                f"{live:,} live session(s); delete {rows:,} row(s)"
            )
            losing = sorted(
                (p for p in consumed if p.rows_to_delete), key=lambda p: -p.rows_to_delete
            )
            if losing:
                text += ", most from " + named([f"{p.tp} ({p.rows_to_delete:,})" for p in losing])
        else:
            text += ": " + named(names)
        out.append(text)
    rest = list(groups.items())[LISTED:]
    if rest:
        count = sum(len(m) for _, m in rest)
        out.append(
            f"  ... and {count:,} partition(s) of {len(rest):,} other failure point reason(s): "
            + named([str(p.tp) for _, m in rest for p in m])
        )
    out.append("  (a line per partition with --all; every value with --json)")
    return out


@dataclass
class RepairPlan:
    """Everything a repair changes; printed by default, performed by :func:`apply_repair`."""

    pipeline: str
    checkpoint: str
    owner: str
    batch_offset: int
    partitions: list[PartitionRepair] = field(default_factory=list)
    outputs: list[OutputDeletion] = field(default_factory=list)
    backup: str | None = None
    nothing_to_do: bool = False
    applied: bool = False
    notes: list[str] = field(default_factory=list)
    tables_from_batch: int | None = None
    """The first change-log batch the session tables lose (``None``: they keep every one)."""
    tables: list[TableRestore] = field(default_factory=list)
    """Per session table: the restore to before ``tables_from_batch``."""

    def starting_offsets(self) -> dict[str, dict[str, int]]:
        """The new checkpoint's ``startingOffsets`` (Spark's per-partition JSON shape)."""
        out: dict[str, dict[str, int]] = {}
        for p in sorted(self.partitions, key=lambda p: (p.topic, p.partition)):
            out.setdefault(p.topic, {})[str(p.partition)] = p.start
        return out

    def failure_points(self) -> dict[str, dict[str, int]]:
        """Per consumed partition, the failure point the plan used."""
        out: dict[str, dict[str, int]] = {}
        for p in sorted(self.partitions, key=lambda p: (p.topic, p.partition)):
            if p.failure_point is not None:
                out.setdefault(p.topic, {})[str(p.partition)] = p.failure_point
        return out

    def delete_from(self) -> dict[TopicPartition, int]:
        """Per consumed partition, the offset from which output rows go."""
        return {p.tp: p.start for p in self.partitions if p.start >= 0}

    def checkpoint_info(self, kept: CheckpointInfo | None = None) -> CheckpointInfo:
        """The fresh checkpoint's info file: ``kept`` (what identifies the pipeline) with the
        owner id, the batch id offset, the starting offsets and what the repair did."""
        return replace(
            kept or CheckpointInfo(),
            id=self.owner,
            batch_offset=self.batch_offset,
            starting_offsets=self.starting_offsets(),
            repaired={
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "backup": self.backup,
                "failure_points": self.failure_points(),
            },
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {
            "pipeline": self.pipeline,
            "checkpoint": self.checkpoint,
            "owner": self.owner,
            "batch_offset": self.batch_offset,
            "starting_offsets": self.starting_offsets(),
            "partitions": [p.to_json() for p in self.partitions],
            "outputs": [o.to_json() for o in self.outputs],
            "rows_to_delete": sum(o.rows for o in self.outputs),
            "backup": self.backup,
            "tables_from_batch": self.tables_from_batch,
            "tables": [t.to_json() for t in self.tables],
            "nothing_to_do": self.nothing_to_do,
            "applied": self.applied,
            "notes": list(self.notes),
        }

    def partition_lines(self, full: bool = False) -> list[str]:
        """A line per partition; past :data:`LISTED` partitions (not ``full``) a line per
        reason of failure point, counting its partitions, sessions and rows and naming
        those that lose the most rows (:func:`group_lines`)."""
        if full or len(self.partitions) <= LISTED:
            return [partition_line(p) for p in self.partitions]
        return group_lines(self.partitions)

    def lines(self, full: bool = False) -> list[str]:
        """The plan for humans (``full``: a line per partition, however many)."""
        verb = "repaired" if self.applied else "repair plan"
        out = [f"{verb} for {self.pipeline!r} (checkpoint {self.checkpoint})"]
        out.extend(self.partition_lines(full))
        for o in self.outputs:
            extra = ""
            if o.files_rewritten or o.files_removed:
                extra = f" ({o.files_rewritten} file(s) rewritten, {o.files_removed} removed)"
            out.append(f"  {o.name} {o.describe}: {o.rows:,} row(s) to delete{extra}")
        for t in self.tables:
            if t.needed:
                out.append(
                    f"  {t.table} table {t.path}: holds batches through {t.holds}; restore to "
                    f"{t.restore_to} (through batch {t.restored_to}); the next run "
                    f"catches it up from the change log"
                )
            else:
                out.append(
                    f"  {t.table} table {t.path}: holds no batch from {self.tables_from_batch}"
                )
        out.append(
            f"  checkpoint: owner {self.owner}, batch ids continue at {self.batch_offset}"
            + (f"; backup at {self.backup}" if self.backup else "")
        )
        out.extend(f"  note: {n}" for n in self.notes)
        if self.nothing_to_do:
            out.append("nothing to do: output and checkpoint already start at these offsets")
        elif not self.applied:
            out.append("nothing changed; run again with --apply to perform it")
        return out
