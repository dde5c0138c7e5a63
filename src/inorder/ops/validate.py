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

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.ops.batchlog import BatchLog, load_batch_log
from inorder.ops.kafka_reads import offsets_for_time, partitions, watermarks
from inorder.ops.output import OutputView
from inorder.ops.recompute import DEFAULT_CHUNK_RECORDS, PartitionRecompute, plan_segments
from inorder.ops.statefiles import load_partition_state, loadable_versions
from inorder.ops.target import OpsTarget
from inorder.records import TopicPartition
from inorder.sinks.base import StoredSink
from inorder.state.entry import KeyEntry, PartitionMeta

_SAMPLES = 5


@dataclass
class PartitionDiff:
    """Validation result of one topic-partition."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int | None
    records: int = 0
    expected_rows: int = 0
    actual_rows: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    first_offset: int | None = None
    exact_batches: bool = True
    started_from_version: int | None = None
    failed: str | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    unchecked_from: int | None = None
    """First offset of output rows whose records expired from Kafka (not checkable)."""
    unchecked_to: int | None = None
    """Kafka's log-start offset: records below it can no longer be recomputed."""
    unchecked_rows: int = 0
    set_aside: dict[str, int] = field(default_factory=dict)
    """Records the integrity policy set aside, by rule (``ignored``: records of reset
    sessions skipped until a new one): the output holds nothing for them, by design."""

    @property
    def checkable(self) -> bool:
        """Whether every output row in the compared range could be recomputed."""
        return self.unchecked_rows == 0

    @property
    def ok(self) -> bool:
        """No discrepancy and no failure."""
        return not (self.missing or self.extra or self.different or self.failed)

    def line(self) -> str:
        """One human line."""
        where = f"{self.topic}[{self.partition}]"
        span = f"offsets {self.from_offset}..{'' if self.to_offset is None else self.to_offset}"
        unchecked = (
            f"; {self.unchecked_rows:,} output rows of offsets {self.unchecked_from}.."
            f"{self.unchecked_to} NOT CHECKABLE: records they depend on expired from Kafka"
            if self.unchecked_rows
            else ""
        )
        aside = (
            "; set aside by the policy: "
            + ", ".join(f"{rule}={n:,}" for rule, n in sorted(self.set_aside.items()))
            if self.set_aside
            else ""
        )
        if self.ok:
            rows = f"{self.expected_rows:,} rows match ({self.records:,} records)"
            status = "ASIDE" if self.set_aside else "OK   " if self.checkable else "NOCHK"
            return f"{status} {where} {span}: {rows}{aside}{unchecked}"
        text = (
            f"DIFF  {where} {span}: first differing offset {self.first_offset}, "
            f"missing {self.missing:,}, extra {self.extra:,}, different {self.different:,} "
            f"(expected {self.expected_rows:,} rows, output has {self.actual_rows:,})"
        )
        if self.failed:
            text += f"; recomputation stopped: {self.failed}"
        return text + unchecked


@dataclass
class ValidationReport:
    """Validation result of a pipeline."""

    partitions: list[PartitionDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every partition matches."""
        return all(p.ok for p in self.partitions)

    @property
    def set_aside(self) -> int:
        """Records the policy set aside over all partitions (their own class: not a
        discrepancy between output and recomputation, but input the output does not hold)."""
        return sum(sum(p.set_aside.values()) for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "partitions": [
                asdict(p) | {"ok": p.ok, "checkable": p.checkable} for p in self.partitions
            ],
            "checkable": all(p.checkable for p in self.partitions),
            "notes": self.notes,
            "set_aside": self.set_aside,
            "totals": {
                k: sum(getattr(p, k) for p in self.partitions)
                for k in (
                    "records",
                    "expected_rows",
                    "actual_rows",
                    "missing",
                    "extra",
                    "different",
                )
            },
        }

    def lines(self) -> list[str]:
        """Human-readable report."""
        out = [p.line() for p in self.partitions]
        bad = [p for p in self.partitions if not p.ok]
        unchecked = [p for p in self.partitions if not p.checkable]
        out.append(
            f"{len(self.partitions)} partition(s) checked, "
            + (
                f"{len(bad)} with discrepancies"
                if bad
                else "the output matches its recomputation"
                if self.set_aside
                else "no discrepancy"
            )
            + (
                f"; {len(unchecked)} with output rows not checkable (records expired from "
                f"Kafka: {sum(p.unchecked_rows for p in unchecked):,} rows)"
                if unchecked
                else ""
            )
        )
        aside = [p for p in self.partitions if p.set_aside]
        if aside:
            out.append(
                f"{self.set_aside:,} record(s) in {len(aside)} partition(s) were set aside by the "
                "integrity policy (see ASIDE lines): the output holds nothing for them, as the "
                "policy decided; not lost in transit, but not in the output either"
            )
        out.extend(f"note: {n}" for n in self.notes)
        return out


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class _Comparer:
    """Accumulates the row-by-row comparison of one partition."""

    def __init__(self, diff: PartitionDiff, keep_rows: bool) -> None:
        self.diff = diff
        self.keep_rows = keep_rows
        self.exp_left: Counter[int] = Counter()
        self.act_left: Counter[int] = Counter()
        self.act_rows: Counter[tuple[int, Any]] = Counter()
        self.columns: list[str] | None = None

    def _rows(self, table: pa.Table | None) -> list[tuple[int, Any, dict[str, Any]]]:
        if table is None or table.num_rows == 0:
            return []
        if self.columns is None:
            self.columns = [c for c in table.column_names if c != "batch_id"]
        cols = [c for c in self.columns if c in table.column_names]
        out = []
        for row in table.select(cols).to_pylist():
            out.append((int(row["offset"]), _freeze(row), row))
        return out

    def _sample(self, kind: str, offset: int, row: dict[str, Any]) -> None:
        if len(self.diff.samples) < _SAMPLES * 2:
            self.diff.samples.append(
                {"kind": kind, "offset": offset, "row": {k: _jsonable(v) for k, v in row.items()}}
            )

    def compare(self, expected: pa.Table | None, actual: pa.Table | None) -> None:
        exp_rows = self._rows(expected)
        self.columns = self.columns  # expected (when present) fixes the compared columns
        act_rows = self._rows(actual)
        self.diff.expected_rows += len(exp_rows)
        self.diff.actual_rows += len(act_rows)
        exp = Counter((o, f) for o, f, _ in exp_rows)
        act = Counter((o, f) for o, f, _ in act_rows)
        exp_only = exp - act
        act_only = act - exp
        if not exp_only and not act_only:
            return
        raw = {(o, f): r for o, f, r in exp_rows + act_rows}
        for (offset, frozen), n in exp_only.items():
            self.exp_left[offset] += n
            self._sample("expected_only", offset, raw[(offset, frozen)])
        for (offset, frozen), n in act_only.items():
            self.act_left[offset] += n
            if self.keep_rows:
                self.act_rows[(offset, frozen)] += n
            self._sample("output_only", offset, raw[(offset, frozen)])

    def late(self, table: pa.Table | None, from_offset: int) -> None:
        """Expected rows emitted after their offset's range was compared (timeouts)."""
        for offset, frozen, row in self._rows(table):
            if offset < from_offset:
                continue
            self.diff.expected_rows += 1
            if self.act_rows[(offset, frozen)] > 0:
                self.act_rows[(offset, frozen)] -= 1
                self.act_left[offset] -= 1
                self.diff.samples = [
                    s
                    for s in self.diff.samples
                    if not (s["kind"] == "output_only" and s["offset"] == offset)
                ]
            else:
                self.exp_left[offset] += 1
                self._sample("expected_only", offset, row)

    def finish(self) -> None:
        d = self.diff
        for offset in sorted(set(self.exp_left) | set(self.act_left)):
            e, a = self.exp_left[offset], self.act_left[offset]
            if not e and not a:
                continue
            both = min(e, a)
            d.different += both
            d.missing += e - both
            d.extra += a - both
            if d.first_offset is None:
                d.first_offset = offset


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


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


def validate(
    target: OpsTarget,
    from_offset: int | None = None,
    from_time_ms: int | None = None,
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
    only: Callable[[TopicPartition], bool] | None = None,
) -> ValidationReport:
    """Recompute every partition of the pipeline and compare with the committed output."""
    report = ValidationReport()
    log = load_batch_log(target.spark_dir, target.engine)
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
    output = OutputView(target.sink)
    out_parts = output.partitions()
    kafka_parts = partitions(target.source_options)
    tps = sorted(set(kafka_parts) | set(out_parts))
    if only is not None:
        tps = [tp for tp in tps if only(tp)]
    marks = watermarks(target.source_options, [tp for tp in tps if tp in set(kafka_parts)])
    starts: Mapping[TopicPartition, int | None] = {}
    if from_time_ms is not None:
        starts = offsets_for_time(target.source_options, list(marks), from_time_ms)
    keep_rows = _has_timeouts(target)
    inexact: list[str] = []
    for tp in tps:
        mark = marks.get(tp)
        if mark is None:  # in the output only: every row there is extra
            diff = PartitionDiff(tp.topic, tp.partition, from_offset or 0, None)
            rows = out_parts[tp][0]
            diff.actual_rows = diff.extra = output.count(tp, from_offset)
            if rows:
                diff.first_offset = max(out_parts[tp][1], from_offset or 0)
            diff.failed = "topic-partition not found in Kafka"
            report.partitions.append(diff)
            continue
        end = last_entry.end.get(tp, mark.high) if last_entry is not None else mark.high
        compare_from = _initial_offset(target, tp, mark.low)
        if from_offset is not None:
            compare_from = max(compare_from, from_offset)
        if from_time_ms is not None:
            at = starts.get(tp)
            compare_from = max(compare_from, end if at is None else at)
        diff = PartitionDiff(tp.topic, tp.partition, compare_from, end)
        expired = _mark_expired(diff, output, out_parts.get(tp), mark.low, from_offset)
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
            report.partitions.append(diff)
            continue
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
        if not exact and keep_rows:
            inexact.append(str(tp))
        recompute = PartitionRecompute(target, tp, entries, meta, chunk_records)
        comparer = _Comparer(diff, keep_rows)
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
        diff.records = recompute.records
        diff.set_aside = dict(recompute.violation_counts)
        if recompute.ignored:
            diff.set_aside["ignored"] = recompute.ignored
        if recompute.failed is not None:
            diff.failed = recompute.failed.message()
        comparer.finish()
        report.partitions.append(diff)
    if inexact:
        report.notes.append(
            "batch history incomplete for "
            + ", ".join(inexact)
            + ": processing-time timeouts were not reproduced (their rows count as extra)"
        )
    return report
