"""What a micro-batch did: the report the progress line, ``--json`` and the status page read.

Built on the driver from the tasks' result rows (:func:`summarize`), before anything is
committed; the commit (:mod:`inorder.engine.batch_commit`) adds whether the sink committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inorder.engine.results import TaskResult
from inorder.engine.violations import ViolationEvent


@dataclass(slots=True)
class PartitionReport:
    """What one topic-partition did in a batch."""

    topic: str
    partition: int
    first_offset: int | None
    last_offset: int
    records: int
    output_rows: int
    state_keys: int
    violation_counts: dict[str, int]
    counters: dict[str, int]
    timings: dict[str, float]


@dataclass(slots=True)
class BatchReport:
    """What a micro-batch did (feeds the progress line and ``--json`` output)."""

    batch_id: int
    committed: bool = True
    records: int = 0
    output_rows: int = 0
    output_files: int = 0
    state_keys: int = 0
    replayed: int = 0
    dead_letters: int = 0
    #: Records skipped as a source's redelivery (:class:`~inorder.processor.Duplicate`).
    duplicates: int = 0
    #: Records of keys reset under ``restart_session``, skipped until a new session.
    ignored: int = 0
    #: Offsets the tasks skipped as lost while reading (``failOnDataLoss=false``).
    skipped_lost: int = 0
    timeouts: int = 0
    violations_by_rule: dict[str, int] = field(default_factory=dict)
    violations_by_partition: dict[str, dict[str, int]] = field(default_factory=dict)
    last_offsets: dict[str, int] = field(default_factory=dict)
    violations: list[ViolationEvent] = field(default_factory=list)
    partitions: list[PartitionReport] = field(default_factory=list)
    processing_time_us: int = 0
    duration_seconds: float = 0.0
    #: Where the batch's time went: ``tasks`` and ``commit`` (driver wall seconds), then the
    #: tasks' own phases summed over partitions (``read``: waiting for Kafka, ``apply``,
    #: ``write``: encoding and staging output, ``state``: the state delta, ``load``: opening
    #: state).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: How the tasks found their topic-partitions' state caches: ``open`` (the worker's
    #: cache database, still open, served the partition in an earlier batch), then exactly
    #: one of ``current`` (at the version needed), ``caught_up`` (behind: the missing deltas
    #: applied) or ``rebuilt`` (read from the checkpoint); ``moved``: partitions whose task
    #: ran in another worker process than in this engine's previous batch (Spark places
    #: tasks); ``databases``: tasks that opened a cache database (a worker's first task, or
    #: every task with ``keep_open=0``).
    state_opens: dict[str, int] = field(default_factory=dict)


#: Task timings summed into :attr:`BatchReport.phase_seconds` (the tasks' own names).
_TASK_PHASES = ("read", "apply", "write", "state", "load")


def task_phases(results: list[TaskResult]) -> dict[str, float]:
    """The tasks' own phase seconds, summed over topic-partitions."""
    return {phase: sum(float(r.timings.get(phase, 0.0)) for r in results) for phase in _TASK_PHASES}


def state_opens(results: list[TaskResult], workers: dict[tuple[str, int], str]) -> dict[str, int]:
    """Count how tasks found their caches; ``workers`` (partition -> last worker) is updated."""
    opens = {"open": 0, "current": 0, "caught_up": 0, "rebuilt": 0, "moved": 0, "databases": 0}
    for r in results:
        last = workers.get((r.topic, r.partition))
        opens["moved"] += last is not None and last != r.worker
        workers[(r.topic, r.partition)] = r.worker
        t = r.timings
        opens["open"] += bool(t.get("cache_reused"))
        opens["databases"] += bool(t.get("cache_opened"))
        found = "current" if t.get("cache_hit") else "caught_up" if t.get("caught_up") else None
        opens[found or "rebuilt"] += 1
    return opens


def summarize(batch_id: int, results: list[TaskResult]) -> BatchReport:
    """Fold task results into a :class:`BatchReport`."""
    report = BatchReport(batch_id=batch_id)
    for r in sorted(results, key=lambda r: (r.topic, r.partition)):
        counts = r.violation_counts
        counters = r.counters
        name = f"{r.topic}[{r.partition}]"
        report.partitions.append(
            PartitionReport(
                r.topic,
                r.partition,
                r.first_offset,
                r.last_offset,
                r.records,
                r.output_rows,
                r.state_keys,
                dict(counts),
                dict(counters),
                dict(r.timings),
            )
        )
        report.records += r.records
        report.output_rows += r.output_rows
        report.state_keys += r.state_keys
        report.replayed += counters.get("replayed", 0)
        report.dead_letters += counters.get("dead_letters", 0)
        report.duplicates += counters.get("duplicates", 0)
        report.ignored += counters.get("ignored", 0)
        report.skipped_lost += counters.get("skipped_lost", 0)
        report.timeouts += counters.get("timeouts", 0)
        report.last_offsets[name] = r.last_offset
        if counts:
            report.violations_by_partition[name] = dict(counts)
        for rule, n in counts.items():
            report.violations_by_rule[rule] = report.violations_by_rule.get(rule, 0) + n
        report.violations.extend(r.violations)
    return report
