"""The partition backend: shuffle-free ordered processing inside ``foreachBatch``.

Per micro-batch ``B`` (:meth:`PartitionBackend.run_batch`), on the driver:

1. The batch's processing time is read from ``<checkpoint>/batches/B.json`` or recorded
   there: a re-run of ``B`` after a crash sees the same time, hence the same timeouts.
2. ONE Spark action, ``df.mapInArrow(task)`` + ``collect``: the source plans one input
   partition per topic-partition; they are coalesced (no shuffle, no Exchange in the plan)
   into at most one task per core of the cluster, each applying its topic-partitions one
   after the other. Per topic-partition the task loads the state as of ``B-1``, applies the
   records in offset order, stages output files, writes the state delta of ``B`` and
   returns a small result row.
3. A ``fail``-policy violation anywhere raises :class:`~inorder.errors.IntegrityError`
   before anything is committed. Otherwise the dead-letter sink and then the sink commit
   batch ``B``. The sink's commit is the batch's commit point: a batch already committed
   there (crash after the commit, before Spark's own commit log) is skipped when re-run.

A crash anywhere before the sink commit leaves staged files and a state version ``B`` that
nobody reads: the re-run of ``B`` ignores the state at ``B`` (loading ``B-1``), rewrites it
identically and commits. See ``docs/engine.md``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_args, get_type_hints

import pyarrow as pa

from inorder.codecs.base import Codec
from inorder.engine.reference import raise_failure
from inorder.engine.rejections import check_rejections
from inorder.engine.results import RESULT_DDL, TaskResult, result_of
from inorder.engine.task import INPUT_EXPRS, TaskSpec, run_task
from inorder.engine.violations import ViolationEvent
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.kafka.options import SourceOptions
from inorder.processor import Processor, processor_types
from inorder.sinks.base import ConsumedOffsets, Sink, SinkError
from inorder.spark.worker_pools import engine_pool
from inorder.state.checkpoint import CheckpointStore
from inorder.state.store import StateOptions


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
    #: How the tasks found their topic-partitions' state caches: ``open`` (the worker still
    #: held it from an earlier batch), then exactly one of ``current`` (at the version
    #: needed), ``caught_up`` (behind: the missing deltas applied) or ``rebuilt`` (read from
    #: the checkpoint); and ``moved``: partitions whose task ran in another worker process
    #: than in this engine's previous batch (Spark places tasks; a moved partition cannot
    #: find its cache open in its new worker).
    state_opens: dict[str, int] = field(default_factory=dict)


def forget_msgspec_caches(*types: Any) -> None:
    """Drop the ``__msgspec_cache__`` msgspec stores on types it has inspected.

    cloudpickle ships classes defined in ``__main__`` (a user's script) by value, and that
    cache object cannot be pickled ("cannot pickle 'msgspec._core.DataclassInfo'"). msgspec
    rebuilds it on first use, so removing it is free.
    """
    seen: set[int] = set()
    stack = list(types)
    while stack:
        tp = stack.pop()
        if id(tp) in seen:
            continue
        seen.add(id(tp))
        stack.extend(get_args(tp))
        if not isinstance(tp, type):
            continue
        if "__msgspec_cache__" in tp.__dict__:
            with contextlib.suppress(AttributeError, TypeError):
                delattr(tp, "__msgspec_cache__")
        try:
            hints = get_type_hints(tp)
        except Exception:
            continue
        stack.extend(hints.values())


def _task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return run_task(spec, batches)


class PartitionBackend:
    """Runs a processor over micro-batches with one ordered task per topic-partition."""

    def __init__(
        self,
        processor: Processor[Any, Any, Any],
        codec: Codec[Any],
        integrity: Integrity,
        checkpoint: str,
        sink: Sink,
        dead_letter_sink: Sink | None = None,
        state_options: StateOptions | None = None,
        storage_options: dict[str, str] | None = None,
        max_tasks: int | None = None,
        source_options: SourceOptions | None = None,
    ) -> None:
        self.processor = processor
        #: When set, the source only plans (``inorder.rangesOnly``) and each task reads its
        #: ranges from Kafka with these options.
        self.source_options = source_options
        #: Tasks per micro-batch at most (``None``: the cluster's cores, Spark's default
        #: parallelism; 0: one task per topic-partition).
        self.max_tasks = max_tasks
        self.codec = codec
        self.integrity = integrity
        self.checkpoint = CheckpointStore(checkpoint, storage_options)
        self.sink = sink
        self.dead_letter_sink = dead_letter_sink
        self.state_options = state_options or StateOptions()
        self._checked = False
        self._workers: dict[tuple[str, int], str] = {}
        self._epoch = ""
        #: Called with the batch id right before the sinks commit (the runner's lease check:
        #: a driver that lost the checkpoint's lease raises there and commits nothing).
        self.commit_guard: Callable[[int], None] | None = None
        #: Where tasks report records applied while they run (the runner's live progress).
        self.progress_to: tuple[str, int] | None = None
        self._types: Any = None
        self._schema: pa.Schema | None = None

    # -- driver checks -----------------------------------------------------------------------

    def check(self) -> None:
        """Before anything runs: output schema, state type vs checkpoint, sinks.

        Raises :class:`~inorder.errors.ConfigError` naming the bad field, the incompatible
        state change, or the unusable sink.
        """
        from inorder.schema import output_schema
        from inorder.state.codec import check_compatible, fingerprint, validate_state_type

        try:
            types = processor_types(self.processor)
        except TypeError as exc:
            raise ConfigError(str(exc)) from None
        schema = output_schema(types.out)
        validate_state_type(types.state)
        meta = self.checkpoint.state_meta()
        if meta is None:
            meta = self.checkpoint.init_state_meta(fingerprint(types.state))
        else:
            check_compatible(meta["fingerprint"], types.state)
        try:
            self.sink.check(schema)
            if self.dead_letter_sink is not None:
                from inorder.engine.task import DEAD_LETTER_SCHEMA

                self.dead_letter_sink.check(DEAD_LETTER_SCHEMA)
        except SinkError as exc:
            raise ConfigError(f"sink: {exc}") from None
        self._types = types
        self._schema = schema
        self._epoch = str(meta["epoch"])
        self._checked = True

    # -- one micro-batch ---------------------------------------------------------------------

    def spec(self, batch_id: int) -> TaskSpec:
        """The task spec of ``batch_id`` (records the batch's processing time)."""
        return self._spec(batch_id, None)

    def _spec(self, batch_id: int, processing_us: int | None) -> TaskSpec:
        """The task spec; ``processing_us=None`` reads (or records) the batch's time."""
        if not self._checked:
            self.check()
        assert self._schema is not None
        if processing_us is None:
            processing_us = self.checkpoint.batch_time_us(batch_id)
        forget_msgspec_caches(self._types.msg, self._types.state, self._types.out)
        return TaskSpec(
            processor=self.processor,
            codec=self.codec,
            integrity=self.integrity,
            checkpoint=self.checkpoint,
            sink=self.sink,
            output_schema=self._schema,
            out_type=self._types.out,
            state_type=self._types.state,
            epoch=self._epoch,
            batch_id=batch_id,
            processing_us=processing_us,
            dead_letter_sink=self.dead_letter_sink,
            state_options=self.state_options,
            source_options=self.source_options,
            progress_to=self.progress_to,
        )

    def plan(self, df: Any, batch_id: int) -> Any:
        """The DataFrame of result rows for ``df`` (no action run)."""
        projected = df.selectExpr(*INPUT_EXPRS)
        tasks = self._task_count(df)
        if tasks:
            # Each task has a fixed cost (a Python worker round trip for the source's read and
            # for the engine, a Kafka consumer, state open/commit): with many small partitions
            # that dominated a micro-batch. More tasks than cores cannot run at once anyway.
            # Coalescing concatenates whole input partitions, in order: no shuffle, and each
            # topic-partition's records stay in offset order within one task.
            projected = projected.coalesce(tasks)
        # In the engine's own worker pool: a task lands in a process that holds state caches.
        with engine_pool(df.sparkSession):
            return projected.mapInArrow(functools.partial(_task, self.spec(batch_id)), RESULT_DDL)

    def _task_count(self, df: Any) -> int:
        if self.max_tasks is not None:
            return max(self.max_tasks, 0)
        try:
            return max(int(df.sparkSession.sparkContext.defaultParallelism), 1)
        except Exception:  # e.g. Spark Connect: no SparkContext; keep one task per partition
            return 0

    def run_tasks(self, df: Any, batch_id: int) -> list[TaskResult]:
        """Run the batch's tasks (state and staged files written), commit nothing."""
        return [result_of(row.asDict()) for row in self.plan(df, batch_id).collect()]

    def run_batch(self, df: Any, batch_id: int) -> BatchReport:
        """Apply, then commit, one micro-batch (``foreachBatch`` body)."""
        started = time.perf_counter()
        if not self._checked:
            self.check()
        if self.sink.is_committed(batch_id):
            return BatchReport(batch_id=batch_id, committed=False)
        results = self.run_tasks(df, batch_id)
        tasks_done = time.perf_counter()
        report = self.commit(batch_id, results)
        report.duration_seconds = time.perf_counter() - started
        report.phase_seconds = {
            "tasks": tasks_done - started,
            "commit": report.duration_seconds - (tasks_done - started),
            **_task_phases(results),
        }
        report.state_opens = _state_opens(results, self._workers)
        return report

    def commit(self, batch_id: int, results: list[TaskResult]) -> BatchReport:
        """Check the task results; raise on failures, else commit the sinks."""
        failures = [r.failed for r in results if r.failed is not None]
        if failures:
            raise_failure(failures)
        check_rejections(batch_id, results, self.integrity)
        report = summarize(batch_id, results)
        files = [f for r in results for f in r.written_files()]
        dl_files = [f for r in results for f in r.written_dead_letter_files()]
        if self.commit_guard is not None:  # the one commit point: fenced here
            self.commit_guard(batch_id)
        if self.dead_letter_sink is not None:
            self.dead_letter_sink.commit(batch_id, dl_files)
        consumed = [
            ConsumedOffsets(r.topic, r.partition, r.first_offset, r.last_offset) for r in results
        ]
        report.committed = self.sink.commit_consumed(batch_id, files, consumed)
        report.output_files = len(files)
        return report


#: Task timings summed into :attr:`BatchReport.phase_seconds` (the tasks' own names).
_TASK_PHASES = ("read", "apply", "write", "state", "load")


def _task_phases(results: list[TaskResult]) -> dict[str, float]:
    return {phase: sum(float(r.timings.get(phase, 0.0)) for r in results) for phase in _TASK_PHASES}


def _state_opens(results: list[TaskResult], workers: dict[tuple[str, int], str]) -> dict[str, int]:
    """Count how tasks found their caches; ``workers`` (partition -> last worker) is updated."""
    opens = {"open": 0, "current": 0, "caught_up": 0, "rebuilt": 0, "moved": 0}
    for r in results:
        last = workers.get((r.topic, r.partition))
        opens["moved"] += last is not None and last != r.worker
        workers[(r.topic, r.partition)] = r.worker
        t = r.timings
        opens["open"] += bool(t.get("cache_reused"))
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
