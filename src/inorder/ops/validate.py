"""``validate``: recompute a pipeline's output from Kafka in plain Python and diff it.

Per topic-partition, the records are read from Kafka in chunks and applied with the same
processor, codec and integrity through the engine's apply core
(:class:`~inorder.ops.recompute.PartitionRecompute`); the output dataset is read through the
sink's committed view for the same offset range, and both sides are compared row by row,
ignoring ``batch_id`` (batch numbering is not part of a row's identity).

Rows are matched per offset as multisets. What is left over at an offset is paired up:
``different`` = min(left-over expected, left-over actual), the rest are ``missing``
(expected only) or ``extra`` (output only). The first offset with any left-over row is the
partition's ``first_offset``.

Processing-time timeouts: rows emitted by ``on_timeout`` depend on when micro-batches ran.
When the checkpoint still holds the batch history from batch 0 (Spark's offsets log plus the
engine's recorded processing time of every batch), the recomputation replays the real batch
boundaries and processing times and timeouts are reproduced exactly. Otherwise the
partition is recomputed as one batch at processing time 0, no processing-time timeout fires,
rows the real run emitted from timeouts are reported as ``extra`` and the partition is marked
``exact_batches: false`` with a note.

What is validated: offsets up to the end of the last batch committed to the sink (from the
offsets log), or up to Kafka's current end when the checkpoint has no log. Memory: one chunk
of records and its rows per side, plus the left-over rows (when the processor has timeouts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow.compute as pc

from inorder.checkpoint.state_files import load_partition_state, loadable_versions
from inorder.kafka.planning import Watermarks
from inorder.ops.batchlog import BatchEntry, BatchLog, load_batch_log
from inorder.ops.kafka_reads import offsets_for_time, partitions, watermarks
from inorder.ops.output import OutputView
from inorder.ops.recompute import DEFAULT_CHUNK_RECORDS, PartitionRecompute, plan_segments
from inorder.ops.target import OpsTarget
from inorder.ops.validate_compare import Comparer
from inorder.ops.validate_progress import ProgressLine
from inorder.ops.validate_report import PartitionDiff, ValidationReport
from inorder.records import TopicPartition
from inorder.sinks.base import StoredSink
from inorder.state.entry import KeyEntry, PartitionMeta

__all__ = ["PartitionDiff", "ValidationPlan", "ValidationReport", "validate"]


def _has_timeouts(target: OpsTarget) -> bool:
    from inorder.processor import Processor

    return type(target.processor).on_timeout is not Processor.on_timeout


def _start_state(
    target: OpsTarget,
    log: BatchLog,
    tp: TopicPartition,
    wanted: int,
    last_batch: int | None,
    at_least: int = 0,
) -> tuple[int | None, dict[str, KeyEntry], PartitionMeta, int | None]:
    """The newest committed state version of ``tp`` ending at or before offset ``wanted``.

    Only versions ending at or after ``at_least`` (Kafka's log start when records expired)
    count; when none ends before ``wanted``, the earliest one after it is taken.
    """
    from inorder.state.codec import StateCodec

    candidates = []
    try:
        versions = loadable_versions(target.engine.versions(tp))
    except Exception:
        versions = []
    for v in versions:
        entry = log.get(v)
        if entry is None or not entry.committed or tp not in entry.end:
            continue
        if last_batch is not None and v > last_batch:
            continue
        if entry.end[tp] >= at_least:
            candidates.append((v, entry.end[tp]))
    before = [c for c in candidates if c[1] <= wanted]
    if before:
        version, end = max(before)
    elif candidates and at_least:
        version, end = min(candidates, key=lambda c: (c[1], c[0]))
    else:
        return None, {}, PartitionMeta(), None
    state = load_partition_state(target.engine, tp, version)
    codec = StateCodec(target.types.state)
    return version, state.decoded(codec.decode), state.meta, end


def _mark_expired(
    diff: PartitionDiff,
    output: OutputView,
    in_output: tuple[int, int, int] | None,
    log_start: int,
    from_offset: int | None,
) -> bool:
    """Record output rows produced by records that expired from Kafka: they cannot be
    recomputed, so they are reported as not checkable instead of silently counted as OK.
    Returns whether there are any."""
    if in_output is None or not in_output[0]:
        return False
    lowest = max(in_output[1], from_offset or 0)
    if lowest >= log_start:
        return False
    tp = TopicPartition(diff.topic, diff.partition)
    rows = output.count(tp, lowest, log_start)
    if rows:
        diff.unchecked_from, diff.unchecked_to, diff.unchecked_rows = lowest, log_start, rows
    return rows > 0


def _initial_offset(target: OpsTarget, tp: TopicPartition, low: int) -> int:
    opts = target.source_options
    if opts.starting_offsets == "json":
        given = opts.starting_positions.get(tp)
        if given is not None and given >= 0:
            return max(given, low)
    return low


def _end(last: BatchEntry | None, tp: TopicPartition, mark: Watermarks) -> int:
    """Where ``tp`` is validated up to: the end of the output's last batch, else Kafka's end."""
    return last.end.get(tp, mark.high) if last is not None else mark.high


@dataclass
class ValidationPlan:
    """What every partition's check shares, fixed once (a worker process gets it whole, so
    all partitions are judged against the same Kafka offsets): the output's last batch
    (``sink_last``, in the checkpoint's numbering), the offsets asked for, each partition's
    Kafka offsets (``marks``), output rows (``out_parts``) and start for ``--from-time``."""

    sink_last: int | None
    from_offset: int | None
    from_time_ms: int | None
    chunk_records: int
    keep_rows: bool
    out_parts: dict[TopicPartition, tuple[int, int, int]]
    marks: dict[TopicPartition, Watermarks]
    starts: dict[TopicPartition, int | None] = field(default_factory=dict)


def plan_validation(
    target: OpsTarget,
    from_offset: int | None = None,
    from_time_ms: int | None = None,
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
    only: Callable[[TopicPartition], bool] | None = None,
) -> tuple[ValidationReport, ValidationPlan, list[TopicPartition]]:
    """The report with its notes so far, the plan, and the partitions to check in order."""
    report = ValidationReport()
    log = load_batch_log(target.layout, target.engine)
    sink = target.sink
    output_last = sink.last_committed_batch() if isinstance(sink, StoredSink) else None
    # After `inorder repair` the output numbers this checkpoint's batch b as offset + b.
    shift = target.batch_offset
    sink_last = output_last - shift if output_last is not None else None
    if sink_last is not None and sink_last < 0:
        sink_last = None  # the output's batches all predate this checkpoint
    if shift:
        report.notes.append(
            f"this checkpoint was repaired: its batch b is the output's batch {shift} + b"
        )
    last_entry = log.get(sink_last) if sink_last is not None else None
    if output_last is not None and last_entry is None:
        report.notes.append(
            f"the checkpoint's offsets log does not hold the output's last committed batch "
            f"{output_last}: validating up to Kafka's current end offsets"
        )
    out_parts = OutputView(target.sink).partitions()
    kafka_parts = partitions(target.source_options)
    tps = sorted(set(kafka_parts) | set(out_parts))
    if only is not None:
        tps = [tp for tp in tps if only(tp)]
    marks = watermarks(target.source_options, [tp for tp in tps if tp in set(kafka_parts)])
    starts: dict[TopicPartition, int | None] = {}
    if from_time_ms is not None:
        starts = dict(offsets_for_time(target.source_options, list(marks), from_time_ms))
    plan = ValidationPlan(
        sink_last,
        from_offset,
        from_time_ms,
        chunk_records,
        _has_timeouts(target),
        dict(out_parts),
        dict(marks),
        starts,
    )
    return report, plan, tps


def plan_progress(target: OpsTarget, plan: ValidationPlan, progress: ProgressLine) -> None:
    """Tell ``progress`` the offsets each of the plan's partitions spans."""
    log = load_batch_log(target.layout, target.engine)
    last_entry = log.get(plan.sink_last) if plan.sink_last is not None else None
    for tp, wm in plan.marks.items():
        progress.plan(_end(last_entry, tp, wm) - wm.low)


def finish_report(report: ValidationReport, checked: list[tuple[PartitionDiff, bool]]) -> None:
    """Add the partitions' checks (in partition order) and the note naming those whose
    timeouts were not reproduced."""
    inexact = [str(TopicPartition(d.topic, d.partition)) for d, not_exact in checked if not_exact]
    report.partitions.extend(d for d, _ in checked)
    if inexact:
        report.notes.append(
            "batch history incomplete for "
            + ", ".join(inexact)
            + ": processing-time timeouts were not reproduced (their rows count as extra)"
        )


def validate(
    target: OpsTarget,
    from_offset: int | None = None,
    from_time_ms: int | None = None,
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
    only: Callable[[TopicPartition], bool] | None = None,
    progress: ProgressLine | None = None,
) -> ValidationReport:
    """Recompute every partition of the pipeline and compare with the committed output
    (``progress``: told the offsets planned and the records checked, chunk by chunk)."""
    report, plan, tps = plan_validation(target, from_offset, from_time_ms, chunk_records, only)
    if progress is not None:
        plan_progress(target, plan, progress)
    checker = PartitionChecker(target, plan)
    finish_report(report, [checker.check(tp, progress) for tp in tps])
    return report


class PartitionChecker:
    """Checks partitions of a plan one at a time (the batch log read once)."""

    def __init__(self, target: OpsTarget, plan: ValidationPlan) -> None:
        self.target, self.plan = target, plan
        self.log = load_batch_log(target.layout, target.engine)
        self.output = OutputView(target.sink)

    def check(
        self, tp: TopicPartition, progress: ProgressLine | None = None
    ) -> tuple[PartitionDiff, bool]:
        """``tp`` recomputed and compared; whether its timeouts were not reproduced."""
        target, plan, log, output = self.target, self.plan, self.log, self.output
        from_offset, from_time_ms = plan.from_offset, plan.from_time_ms
        sink_last, keep_rows = plan.sink_last, plan.keep_rows
        last_entry = log.get(sink_last) if sink_last is not None else None
        mark = plan.marks.get(tp)
        if mark is None:  # in the output only: every row there is extra
            diff = PartitionDiff(tp.topic, tp.partition, from_offset or 0, None)
            rows = plan.out_parts[tp][0]
            diff.actual_rows = diff.extra = output.count(tp, from_offset)
            if rows:
                diff.first_offset = max(plan.out_parts[tp][1], from_offset or 0)
            diff.failed = "topic-partition not found in Kafka"
            return diff, False
        end = _end(last_entry, tp, mark)
        compare_from = _initial_offset(target, tp, mark.low)
        if from_offset is not None:
            compare_from = max(compare_from, from_offset)
        if from_time_ms is not None:
            at = plan.starts.get(tp)
            compare_from = max(compare_from, end if at is None else at)
        diff = PartitionDiff(tp.topic, tp.partition, compare_from, end)
        expired = _mark_expired(diff, output, plan.out_parts.get(tp), mark.low, from_offset)
        version, entries, meta, apply_start = _start_state(
            target, log, tp, compare_from, sink_last, at_least=mark.low if expired else 0
        )
        diff.started_from_version = version
        if expired and version is None:
            # Records below the log start were applied, and no saved state lies past them:
            # a recomputation from the log start with empty state would judge every later
            # row against the wrong state. Nothing of this partition can be checked.
            diff.unchecked_to = end
            diff.unchecked_rows = output.count(tp, diff.unchecked_from, end)
            return diff, False
        if apply_start is None:
            apply_start = _initial_offset(target, tp, mark.low)
        elif expired and apply_start > compare_from:
            # The first saved state past the log start: rows before it are not checkable.
            diff.from_offset = compare_from = apply_start
            diff.unchecked_to = apply_start
            diff.unchecked_rows = output.count(tp, diff.unchecked_from, apply_start)
        segments, exact = plan_segments(
            log if log.batches else None, tp, apply_start, end, sink_last
        )
        if version is not None:
            segments = [s for s in segments if s.batch_id > version]
        diff.exact_batches = exact
        recompute = PartitionRecompute(target, tp, entries, meta, plan.chunk_records)
        comparer = Comparer(diff, keep_rows)
        for chunk in recompute.run(segments, apply_start):
            comparer.late(chunk.late, compare_from)
            lo = max(chunk.start, compare_from)
            hi = None if chunk.final else chunk.end
            if hi is not None and hi <= lo:
                continue
            expected = chunk.rows
            if expected is not None and lo > chunk.start:
                expected = expected.filter(pc.greater_equal(expected.column("offset"), lo))
            comparer.compare(expected, output.read(tp, lo, hi))
            if progress is not None:
                progress.advance(chunk.records, str(tp))
        diff.records = recompute.records
        diff.set_aside = dict(recompute.violation_counts)
        if recompute.ignored:
            diff.set_aside["ignored"] = recompute.ignored
        if recompute.failed is not None:
            diff.failed = recompute.failed.message()
        comparer.finish()
        return diff, not exact and keep_rows
