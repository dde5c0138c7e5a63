"""The rows of the status page, computed from values only (no I/O): partitions, batches,
integrity events and the ``inorder replay`` command that steps through each of them."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from inorder.ops.batchlog import BatchLog
from inorder.ops.inspect import BatchInfo, PartitionStateInfo
from inorder.records import TopicPartition

#: Committed batches the records/s of a partition is measured over.
RATE_WINDOW = 10


@dataclass
class PartitionRow:
    """One topic-partition: where the pipeline is, how far behind, how fast, how big."""

    topic: str
    partition: int
    committed: int | None
    end_offset: int | None
    lag: int | None
    records_per_second: float | None
    last_batch_at: str | None
    state_keys: int | None = None
    state_bytes: int | None = None
    events: int = 0
    resets: int = 0
    #: Records of reset sessions skipped since (until each session's next snapshot), over
    #: the batch history kept.
    ignored: int = 0


#: What a batch shows as its state: Spark committed it; it runs now; a run stopped while it
#: was planned or running (the next start re-runs it); not committed, whether it runs is
#: not known from here (an object-store checkpoint, another machine's run).
BATCH_STATES = ("committed", "running", "interrupted", "not committed")


@dataclass
class BatchRow:
    """One micro-batch: its records, output and where its time went."""

    batch_id: int
    output_batch_id: int
    committed: bool
    #: One of :data:`BATCH_STATES`.
    state: str
    #: Whether the output holds this batch's rows although Spark has not committed it yet
    #: (the sink commits first, Spark's commit follows: a re-run then writes nothing).
    output_committed: bool
    planned_at: str | None
    duration_seconds: float | None
    records: int
    output_rows: int | None = None
    output_files: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)


@dataclass
class EventRow:
    """Integrity events of one rule in one partition and batch, or one session reset."""

    kind: str
    """``integrity`` (counted per batch; the offsets are the batch's range) or ``reset``."""
    rule: str
    topic: str
    partition: int
    batch_id: int | None
    first_offset: int | None
    last_offset: int | None
    count: int
    replay: str
    key: str | None = None


def iso(ts: float | None) -> str | None:
    """A Unix time as ISO 8601 UTC (seconds)."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def parse_tp(text: str) -> TopicPartition | None:
    """``topic[p]`` back to a topic-partition (``None`` when it is not that shape)."""
    topic, bracket, rest = text.rpartition("[")
    if not bracket or not rest.endswith("]") or not rest[:-1].isdigit():
        return None
    return TopicPartition(topic, int(rest[:-1]))


def replay_command(
    reference: str,
    tp: TopicPartition,
    first: int | None,
    last: int | None,
    *,
    on_violation: bool = False,
) -> str:
    """The ``inorder replay`` command stepping through ``tp``'s offsets ``first..last``."""
    parts = ["inorder", "replay", reference, "--topic", tp.topic, "--partition", str(tp.partition)]
    if first is not None:
        parts += ["--from-offset", str(first)]
    if last is not None:
        parts += ["--to-offset", str(last)]
    if on_violation:
        parts.append("--break-on-violation")
    return shlex.join(parts)


def _window_rate(window: Sequence[tuple[Any, BatchInfo]], key: str) -> tuple[int, float | None]:
    """Records of ``key`` in the window's batches, and the seconds those batches ran.

    Only the batches' own time counts: the pauses between them (a trigger interval, an
    idle stream, a stopped pipeline) are not processing, and counting them made a window
    opened by one small batch long ago report a tiny rate.
    """
    records, seconds = 0, 0.0
    for _, info in window:
        start, end = info.ranges.get(key, (-1, -1))
        records += max(0, end - start) if start >= 0 else 0
        if info.duration_seconds is not None:
            seconds += info.duration_seconds
    return records, (seconds if seconds > 0 else None)


def partition_rows(
    log: BatchLog,
    infos: Sequence[BatchInfo],
    ends: Mapping[TopicPartition, int] | None,
    spark_lag: Mapping[str, int] | None,
    state: Sequence[PartitionStateInfo],
    events: Mapping[TopicPartition, int],
) -> list[PartitionRow]:
    """Per topic-partition: committed and end offsets, lag, records/s, last batch, state.

    ``ends`` are the broker's end offsets (``None``: not reachable); without them the lag is
    the one Spark saw when it planned the newest batch (``spark_lag``), when known. The
    records/s are a partition's records over the last :data:`RATE_WINDOW` committed
    batches divided by the time those batches ran (their durations, summed).
    """
    last = log.last_committed()
    committed = dict(last.end) if last is not None else {}
    done = [(b, i) for b, i in zip(log.batches, infos, strict=True) if b.committed]
    window = done[-RATE_WINDOW:]
    sizes = {(s.topic, s.partition): s for s in state}
    tps = sorted(set(committed) | set(ends or {}) | {TopicPartition(*k) for k in sizes})
    rows = []
    for tp in tps:
        key = str(tp)
        records, seconds = _window_rate(window, key)
        last_at = None
        for entry, info in reversed(done):
            start, end = info.ranges.get(key, (-1, -1))
            if end > start >= 0:
                last_at = iso(entry.committed_at)
                break
        position = committed.get(tp)
        end_offset = None if ends is None else ends.get(tp)
        if end_offset is not None:
            lag: int | None = max(0, end_offset - (position or 0))
        else:
            lag = None if spark_lag is None else spark_lag.get(key)
        size = sizes.get((tp.topic, tp.partition))
        rows.append(
            PartitionRow(
                tp.topic,
                tp.partition,
                position,
                end_offset,
                lag,
                None if seconds is None else round(records / seconds, 1),
                last_at,
                None if size is None else size.keys,
                None if size is None else size.state_bytes,
                events.get(tp, 0),
            )
        )
    return rows


def batch_state(info: BatchInfo, newest: bool, running: bool | None) -> str:
    """The state a batch shows (one of :data:`BATCH_STATES`)."""
    if info.committed:
        return "committed"
    if running is None:
        return "not committed"
    # Spark plans one batch at a time: only the newest can be in flight.
    return "running" if running and newest else "interrupted"


def batch_rows(
    infos: Sequence[BatchInfo],
    history: Mapping[int, Mapping[str, Any]],
    output: Mapping[int, tuple[int, int]] | None,
    batch_offset: int,
    running: bool | None = None,
) -> list[BatchRow]:
    """The batches of the log joined with their recorded progress and their output.

    ``output`` maps an output batch id to its (rows, files) still in the output (compaction
    merges files of old batches: theirs are then unknown); the recorded progress line wins.
    A batch Spark has not committed shows only what its output holds: a progress line of
    its batch id is another attempt's (a run's line is recorded after Spark's commit).
    ``running``: whether a run holds the checkpoint now (``None``: unknown).
    """
    rows = []
    newest = max((i.batch_id for i in infos), default=None)
    for info in infos:
        line = (history.get(info.batch_id) or {}) if info.committed else {}
        out_rows = line.get("output_rows")
        out_files = line.get("output_files")
        if line.get("committed") is False:
            # A re-run that found the sink had committed the batch already (a crash after
            # the sink's commit, before Spark's) wrote nothing itself: the batch's rows are
            # the earlier attempt's, known from the output only.
            out_rows = out_files = None
        found = None if output is None else output.get(info.batch_id + batch_offset)
        if out_rows is None and found is not None:
            out_rows, out_files = found
        elif out_rows is None and output is not None and info.committed:
            out_rows, out_files = 0, 0
        rows.append(
            BatchRow(
                info.batch_id,
                info.batch_id + batch_offset,
                info.committed,
                batch_state(info, info.batch_id == newest, running),
                not info.committed and found is not None,
                info.planned_at,
                info.duration_seconds,
                info.records_planned,
                out_rows,
                out_files,
                {str(k): float(v) for k, v in (line.get("seconds") or {}).items()},
                {str(k): int(v) for k, v in (line.get("violations") or {}).items()},
            )
        )
    return rows


def integrity_events(
    reference: str, infos: Sequence[BatchInfo], history: Mapping[int, Mapping[str, Any]]
) -> list[EventRow]:
    """Integrity events per batch, rule and partition, newest first, each with its replay."""
    by_id = {i.batch_id: i for i in infos}
    out = []
    for batch_id in sorted(history, reverse=True):
        per_partition = history[batch_id].get("violations_by_partition") or {}
        for name, counts in sorted(per_partition.items()):
            tp = parse_tp(name)
            if tp is None:
                continue
            info = by_id.get(batch_id)
            start, end = info.ranges.get(name, (-1, -1)) if info else (-1, -1)
            first = start if start >= 0 else None
            last = end - 1 if end > start >= 0 else None
            for rule, count in sorted(counts.items()):
                command = replay_command(reference, tp, first, last, on_violation=True)
                out.append(
                    EventRow(
                        "integrity", rule, tp.topic, tp.partition, batch_id, first, last,
                        int(count), command,
                    )
                )  # fmt: skip
    return out


def events_by_partition(events: Sequence[EventRow]) -> dict[TopicPartition, int]:
    """Integrity events and resets counted per topic-partition."""
    counts: dict[TopicPartition, int] = {}
    for e in events:
        tp = TopicPartition(e.topic, e.partition)
        counts[tp] = counts.get(tp, 0) + e.count
    return counts
