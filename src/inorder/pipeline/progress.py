"""Progress output: one line per trigger for humans (rich or plain), JSON lines for machines."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, TextIO

ProgressMode = Literal["auto", "rich", "plain", "json", "quiet"]


@dataclass(slots=True)
class BatchProgress:
    """What one micro-batch did, for the progress line."""

    batch_id: int
    records: int
    records_per_second: float
    duration_seconds: float
    lag: int | None
    state_keys: int
    output_rows: int
    output_files: int
    violations: dict[str, int] = field(default_factory=dict)
    committed: bool = True
    #: Integrity events by ``topic[partition]``, then by rule (only partitions that had any).
    violations_by_partition: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Where the time went, in seconds: the backend's phases (see ``BatchReport``) and
    #: Spark's own steps of the trigger (``spark_latestOffset``, ``spark_walCommit``, ...).
    seconds: dict[str, float] = field(default_factory=dict)
    #: How the tasks found their topic-partitions' state caches (see ``BatchReport``).
    state_opens: dict[str, int] = field(default_factory=dict)
    #: Records set aside by the policy: dead-lettered, and skipped as a reset key's.
    dead_letters: int = 0
    ignored: int = 0
    #: Records skipped as a source's redelivery: handled exactly, not set aside.
    duplicates: int = 0
    #: ``ignored`` by ``topic[partition]`` (only partitions that had any).
    ignored_by_partition: dict[str, int] = field(default_factory=dict)
    #: Offsets no longer in Kafka (expired, or their topic deleted) that the source skipped
    #: under ``fail_on_data_loss = false``: records lost by policy, never read.
    skipped_lost: int = 0
    #: Partitions of deleted topics the source dropped from its plan.
    pruned_partitions: int = 0


#: ``inorder run``'s exit code when the run ended normally but its policy set data aside
#: (``[pipeline] set_aside_exit_code`` changes it; 1 is an error, 2 a setting, 130 Ctrl-C).
SET_ASIDE_EXIT_CODE = 3


@dataclass(slots=True)
class RunSummary:
    """What a whole run did; printed at the end and returned by ``Pipeline.run()``."""

    batches: int = 0
    records: int = 0
    output_rows: int = 0
    output_files: int = 0
    violations: dict[str, int] = field(default_factory=dict)
    violations_by_partition: dict[str, dict[str, int]] = field(default_factory=dict)
    last_batch_id: int | None = None
    stopped_because: str = ""
    seconds: float = 0.0
    output: str = ""
    dead_letters: int = 0
    ignored: int = 0
    duplicates: int = 0
    #: Offsets skipped as lost under ``fail_on_data_loss = false`` (see ``BatchProgress``).
    skipped_lost: int = 0
    #: Partitions of deleted topics dropped from the plan (see ``BatchProgress``).
    pruned_partitions: int = 0
    #: The violation policy the run applied, and where its dead letters go (if anywhere).
    policy: str = ""
    dead_letter_output: str = ""

    def add(self, batch: BatchProgress) -> None:
        """Account for one finished batch."""
        self.batches += 1
        self.records += batch.records
        self.output_rows += batch.output_rows
        self.output_files += batch.output_files
        self.last_batch_id = batch.batch_id
        self.dead_letters += batch.dead_letters
        self.ignored += batch.ignored
        self.duplicates += batch.duplicates
        self.skipped_lost += batch.skipped_lost
        self.pruned_partitions += batch.pruned_partitions
        for rule, count in batch.violations.items():
            self.violations[rule] = self.violations.get(rule, 0) + count
        for partition, counts in batch.violations_by_partition.items():
            mine = self.violations_by_partition.setdefault(partition, {})
            for rule, count in counts.items():
                mine[rule] = mine.get(rule, 0) + count

    @property
    def set_aside(self) -> bool:
        """Whether a policy set any data aside: dead-lettered, reset or ignored records, or
        offsets skipped as lost because ``fail_on_data_loss`` is off.

        A run that did exits with :data:`SET_ASIDE_EXIT_CODE` from ``inorder run`` (unless
        the pipeline says otherwise), so a scheduler never sees it as a clean run.
        """
        return bool(self.dead_letters or self.ignored or self.violations or self.skipped_lost)

    def set_aside_text(self) -> str:
        """One line saying what the policy set aside and where, or ``""`` if nothing."""
        if not self.set_aside:
            return ""
        parts = []
        if self.skipped_lost:
            parts.append(
                f"{self.skipped_lost:,} offset(s) no longer in Kafka skipped, never read "
                "(fail_on_data_loss = false)"
            )
        events = sum(self.violations.values())
        if events or self.dead_letters or self.ignored:
            parts.append(f"{events:,} integrity event(s) under on_violation = {self.policy!r}")
        if self.dead_letters:
            where = f" in {self.dead_letter_output}" if self.dead_letter_output else ""
            parts.append(f"{self.dead_letters:,} record(s) dead-lettered{where}")
        if self.policy == "restart_session":
            parts.append(f"{self.ignored:,} later record(s) of reset sessions ignored")
        return "set aside: " + "; ".join(parts)


@dataclass
class RunningBatch:
    """A micro-batch still running: what a terminal shows while waiting for its line."""

    batch_id: int
    seconds: float
    tasks_done: int = 0
    tasks_total: int = 0
    planned_records: int | None = None
    #: Records applied so far, as the tasks report them while they run (partition backend).
    applied_records: int | None = None
    #: ``"tables"`` once the change log is committed and the session tables are written.
    phase: str | None = None


def format_running(r: RunningBatch) -> str:
    """One line: batch, elapsed time, tasks done, records applied of planned, rate and ETA."""
    parts = [f"batch {r.batch_id} running for {r.seconds:.0f} s"]
    if r.phase == "tables":
        parts[0] += ": writing the session tables"
        if r.planned_records is not None:
            parts.append(f"{r.planned_records:,} records applied")
        return ", ".join(parts)
    if r.tasks_total:
        parts.append(f"tasks {r.tasks_done}/{r.tasks_total}")
    if r.applied_records is not None and r.planned_records:
        applied = min(r.applied_records, r.planned_records)
        text = f"{applied:,} of {r.planned_records:,} records applied"
        rate = applied / r.seconds if r.seconds > 0 else 0.0
        if rate > 0:
            left = (r.planned_records - applied) / rate
            text += f" ({rate:,.0f}/s, about {_duration(left)} left)"
        parts.append(text)
    elif r.planned_records is not None:
        parts.append(f"{r.planned_records:,} records planned")
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s`` or ``2 h 10 min``: an ETA a person reads at a glance."""
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


class ProgressReporter(Protocol):
    """Where progress goes."""

    def batch(self, progress: BatchProgress) -> None:
        """One finished micro-batch."""
        ...

    def info(self, text: str) -> None:
        """A human note (start, stop)."""
        ...

    def summary(self, summary: RunSummary) -> None:
        """The end of the run."""
        ...


def _violations_text(violations: dict[str, int]) -> str:
    if not violations:
        return "0"
    return ",".join(f"{rule}={count}" for rule, count in sorted(violations.items()))


#: Partitions a progress line names with their integrity events (the rest are counted).
PARTITIONS_NAMED = 5


def _by_partition_text(by_partition: dict[str, dict[str, int]]) -> str:
    """The partitions with the most events first, the first :data:`PARTITIONS_NAMED` named
    with their counts, the others counted (a line stays readable at thousands of topics)."""
    ranked = sorted(by_partition.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    text = "; ".join(
        f"{partition}: {_violations_text(counts)}"
        for partition, counts in ranked[:PARTITIONS_NAMED]
    )
    rest = ranked[PARTITIONS_NAMED:]
    if rest:
        events = sum(sum(counts.values()) for _, counts in rest)
        text += f"; and {len(rest):,} more partition(s) with {events:,} event(s)"
    return text


def format_batch(p: BatchProgress) -> str:
    """The plain one-line form of a batch's progress."""
    lag = "?" if p.lag is None else f"{p.lag:,}"
    line = (
        f"batch {p.batch_id:>5}  records {p.records:>9,}  {p.records_per_second:>10,.0f} rec/s  "
        f"lag {lag:>9}  state keys {p.state_keys:>8,}  out rows {p.output_rows:>9,}  "
        f"files {p.output_files:>3}  violations {_violations_text(p.violations)}  "
        f"({p.duration_seconds:.2f} s)"
    )
    if p.duplicates:
        line += f"  duplicates {p.duplicates:,}"
    if p.ignored:
        line += f"  ignored {p.ignored:,}"
    if p.skipped_lost:
        line += f"  lost offsets skipped {p.skipped_lost:,}"
    if p.violations_by_partition:
        line += f"  [{_by_partition_text(p.violations_by_partition)}]"
    return line


def format_summary(s: RunSummary) -> str:
    """The plain multi-line summary of a run."""
    lines = [
        f"stopped: {s.stopped_because}",
        f"batches: {s.batches} (last batch id {s.last_batch_id})",
        f"records: {s.records:,} in {s.seconds:.1f} s",
        f"output rows: {s.output_rows:,} in {s.output_files:,} files",
        f"integrity events: {_violations_text(s.violations)}",
    ]
    if s.duplicates:
        lines.append(f"duplicates skipped (a source's redelivery): {s.duplicates:,}")
    if s.set_aside:
        lines.append(s.set_aside_text())
    if s.pruned_partitions:
        # Not set aside by itself: a topic read to its end and then deleted is routine. Its
        # unread records count as lost above only if the run saw them before the deletion.
        lines.append(f"partitions of deleted topics dropped from the plan: {s.pruned_partitions:,}")
    if s.violations_by_partition:
        by_partition = _by_partition_text(s.violations_by_partition)
        lines.append(f"integrity events by partition: {by_partition}")
    if s.output:
        lines.append(f"output: {s.output}")
    return "\n".join(lines)


class PlainReporter:
    """Plain text lines on stderr (stdout stays free for results)."""

    def __init__(self, stream: TextIO | None = None, heartbeat_seconds: float = 15.0) -> None:
        self._stream = stream or sys.stderr
        self._heartbeat = heartbeat_seconds
        self._next_heartbeat: tuple[int, float] = (-1, 0.0)

    def running(self, status: RunningBatch) -> None:
        """A line every ``heartbeat_seconds`` while a long batch runs (logs stay readable)."""
        batch_id, due = self._next_heartbeat
        if batch_id != status.batch_id:
            self._next_heartbeat = (status.batch_id, self._heartbeat)
            return
        if status.seconds >= due:
            print(format_running(status), file=self._stream, flush=True)
            self._next_heartbeat = (batch_id, due + self._heartbeat)

    def batch(self, progress: BatchProgress) -> None:
        """Print the batch line."""
        print(format_batch(progress), file=self._stream, flush=True)

    def info(self, text: str) -> None:
        """Print a note."""
        print(text, file=self._stream, flush=True)

    def summary(self, summary: RunSummary) -> None:
        """Print the summary."""
        print(format_summary(summary), file=self._stream, flush=True)


class RichReporter(PlainReporter):
    """The same lines, coloured by rich when on a terminal."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self._console = Console(stderr=True, highlight=False)
        self._status: Any = None

    def running(self, status: RunningBatch) -> None:
        """A live status line (spinner, elapsed time, tasks), replaced by the batch line."""
        text = format_running(status)
        if self._status is None:
            self._status = self._console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def _end_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def batch(self, progress: BatchProgress) -> None:
        """Print the batch line, violations in red."""
        self._end_status()
        style = "red" if progress.violations else None
        self._console.print(format_batch(progress), style=style, markup=False)

    def info(self, text: str) -> None:
        """Print a note, dimmed."""
        self._end_status()
        self._console.print(text, style="dim", markup=False)

    def summary(self, summary: RunSummary) -> None:
        """Print the summary in bold."""
        self._end_status()
        self._console.print(format_summary(summary), style="bold", markup=False)


class JsonReporter:
    """JSON lines on stdout: {"event": "batch"|"info"|"summary", ...}."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout

    def _emit(self, event: str, payload: dict[str, Any]) -> None:
        print(
            json.dumps({"event": event, **payload}, sort_keys=True), file=self._stream, flush=True
        )

    def batch(self, progress: BatchProgress) -> None:
        """Emit a batch event."""
        self._emit("batch", asdict(progress))

    def info(self, text: str) -> None:
        """Emit an info event."""
        self._emit("info", {"message": text})

    def summary(self, summary: RunSummary) -> None:
        """Emit the summary event."""
        self._emit(
            "summary",
            {
                **asdict(summary),
                "set_aside": summary.set_aside,
                "set_aside_text": summary.set_aside_text(),
            },
        )


class QuietReporter:
    """Nothing but errors."""

    def batch(self, progress: BatchProgress) -> None:
        """Say nothing."""

    def info(self, text: str) -> None:
        """Say nothing."""

    def summary(self, summary: RunSummary) -> None:
        """Say nothing."""


def make_reporter(mode: str) -> ProgressReporter:
    """The reporter for a progress mode ("auto" picks rich on a terminal, plain otherwise)."""
    if mode == "auto":
        mode = "rich" if sys.stderr.isatty() else "plain"
    reporters: dict[str, type[Any]] = {
        "rich": RichReporter,
        "plain": PlainReporter,
        "json": JsonReporter,
        "quiet": QuietReporter,
    }
    if mode not in reporters:
        raise ValueError(f"progress must be one of auto, {', '.join(reporters)}; not {mode!r}")
    reporter: ProgressReporter = reporters[mode]()
    return reporter
