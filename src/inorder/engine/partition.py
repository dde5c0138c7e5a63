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
3. :class:`~inorder.engine.batch_commit.BatchCommit`: a ``fail``-policy violation anywhere
   raises :class:`~inorder.errors.IntegrityError` before anything is committed; otherwise
   the lease fence, the dead-letter sink and then the sink commit batch ``B``, then the
   after-commit hooks (session materializer and tables) run. The sink's commit is the
   batch's commit point: a batch already committed there (crash after the commit, before
   Spark's own commit log) is not committed again when re-run; only its hooks catch up.

A crash anywhere before the sink commit leaves staged files and a state version ``B`` that
nobody reads: the re-run of ``B`` ignores the state at ``B`` (loading ``B-1``), rewrites it
identically and commits. See ``docs/engine.md``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, get_args, get_type_hints

import pyarrow as pa

from inorder.codecs.base import Codec
from inorder.engine.batch_commit import BatchCommit
from inorder.engine.batch_report import BatchReport, state_opens, task_phases
from inorder.engine.plan_coverage import check_coverage
from inorder.engine.results import RESULT_DDL, TaskResult, result_of
from inorder.engine.task import INPUT_EXPRS, TaskSpec, run_task
from inorder.errors import ConfigError, InorderError
from inorder.integrity import Integrity
from inorder.kafka.options import SourceOptions
from inorder.processor import Processor, processor_types
from inorder.records import TopicPartition
from inorder.sinks.base import Sink, SinkError
from inorder.spark.worker_pools import engine_pool
from inorder.state.checkpoint import WRITTEN_FORMAT, CheckpointStore
from inorder.state.store import StateOptions

_log = logging.getLogger(__name__)


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
        #: The batch's commit, steps 1-5 (the runner sets its fence and after-commit hooks).
        self.batch_commit = BatchCommit(sink, dead_letter_sink, integrity)
        #: Where tasks report records applied while they run (the runner's live progress).
        self.progress_to: tuple[str, int] | None = None
        self._types: Any = None
        self._schema: pa.Schema | None = None
        #: The ranges the source planned for a batch (Spark's offsets log), when the tasks
        #: read Kafka themselves: their results must cover them before anything commits.
        self.planned_ranges: Callable[[int], Mapping[TopicPartition, tuple[int, int]] | None]
        self.planned_ranges = lambda batch_id: None

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
        delta_files = self.state_options.delta_files
        if delta_files not in ("partition", "task"):
            raise ConfigError(
                f"state delta_files {delta_files!r} is not known: use 'partition' (a file per "
                "topic-partition and batch) or 'task' (one per task and batch)"
            )
        state_format = 3 if delta_files == "task" else WRITTEN_FORMAT
        meta = self.checkpoint.state_meta()
        if meta is None:
            meta = self.checkpoint.init_state_meta(fingerprint(types.state), state_format)
        else:
            check_compatible(meta["fingerprint"], types.state)
            # Before any batch (or seed) writes a state file of this release's format into
            # a checkpoint an earlier format made: from here on that release refuses it.
            meta = self.checkpoint.adopt_state_meta(meta, state_format)
        try:
            self.sink.check(schema)
            if self.dead_letter_sink is not None:
                from inorder.engine.task_output import DEAD_LETTER_SCHEMA

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
            report = BatchReport(batch_id=batch_id, committed=False)
            self.batch_commit.after_commit(report)
            return report
        results = self.run_tasks(df, batch_id)
        if self.source_options is not None:
            self._check_coverage(batch_id, results)
        tasks_done = time.perf_counter()
        report = self.commit(batch_id, results)
        report.duration_seconds = time.perf_counter() - started
        report.phase_seconds = {
            "tasks": tasks_done - started,
            "commit": report.duration_seconds - (tasks_done - started),
            **task_phases(results),
        }
        report.state_opens = state_opens(results, self._workers)
        self.batch_commit.after_commit(report)
        return report

    def _check_coverage(self, batch_id: int, results: list[TaskResult]) -> None:
        """Raise if the results miss a range the source planned (``PlanNotCovered``)."""
        try:
            planned = self.planned_ranges(batch_id)
        except (OSError, InorderError) as exc:
            # The offsets log out of reach (a store's passing error): the batch goes on as
            # it would without this check, which only guards against a bug.
            _log.warning("batch %d: planned ranges not read, not checked: %s", batch_id, exc)
            return
        if planned is not None:
            check_coverage(batch_id, planned, results)

    def commit(self, batch_id: int, results: list[TaskResult]) -> BatchReport:
        """Check the task results; raise on failures, else commit the sinks (steps 1-4)."""
        return self.batch_commit.commit(batch_id, results)
