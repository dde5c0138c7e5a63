"""Running a pipeline (:class:`~inorder.pipeline.spec.PipelineSpec`) as a Spark streaming query.

The query is ``source -> foreachBatch``; inside each micro-batch the backend applies the
processor (one task per topic-partition, no shuffle), stages output files and state, and the
driver commits the sink. Spark's own checkpoint (``<checkpoint>/spark``) records which offsets
belong to which batch id; inorder's (``<checkpoint>/engine``) holds state versioned by batch id,
so a batch re-run after a crash sees exactly the state it saw the first time.

Stopping: SIGINT/SIGTERM ask for a stop; the runner waits for the running batch to finish and
stops the query between triggers. A batch that has started is either finished and committed
or re-run by the next start: never half-applied.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.lease import DEFAULT_DURATION, CheckpointLease
from inorder.errors import ConfigError, InorderError
from inorder.integrity_fit import check_fits
from inorder.pipeline.after_commit import after_commit_hooks
from inorder.pipeline.batch_history import BatchHistory
from inorder.pipeline.failures import (
    SLOW_PYTHON_START_NOTE,
    explain_exception,
    explain_failure,
    slow_python_start,
)
from inorder.pipeline.identity import RecordedSettings, claim_checkpoint
from inorder.pipeline.live_progress import LiveProgress
from inorder.pipeline.observer import SafeObservers
from inorder.pipeline.progress import (
    ProgressReporter,
    RunningBatch,
    RunSummary,
    make_reporter,
)
from inorder.pipeline.query import trigger_kwargs
from inorder.pipeline.resume import prepare_run
from inorder.pipeline.sink_background import finish_sinks, guard_sinks
from inorder.pipeline.spark_progress import (
    batch_lag,
    batch_progress,
    default_parallelism,
    planned_records,
    progress_dict,
    task_counts,
)
from inorder.pipeline.stop_signals import install_stop_signals

if TYPE_CHECKING:
    from inorder.pipeline.spark import EarlySession
    from inorder.pipeline.spec import PipelineSpec
    from inorder.sinks.base import Sink


#: Query starts per run: a query that ended only because Spark gave up on a Python process's
#: start (:func:`~inorder.pipeline.failures.slow_python_start`) is started again.
QUERY_STARTS = 3


class _StopRequested(Exception):
    """Raised inside foreachBatch to end the query before a batch starts any work."""


class PipelineRunner:
    """Runs one pipeline to completion (available-now/once) or until stopped."""

    def __init__(
        self,
        pipeline: PipelineSpec[Any, Any, Any],
        reporter: ProgressReporter | None = None,
        handle_signals: bool = True,
        stop_after_batches: int | None = None,
        settings: RecordedSettings | None = None,
        accept_changes: bool = False,
        early_session: EarlySession | None = None,
    ) -> None:
        self.pipeline = pipeline
        # The session `inorder run` started beside the pre-flight checks, if it did.
        self._early = early_session
        self.settings = settings
        self.accept_changes = accept_changes
        self.reporter = reporter or make_reporter(pipeline.progress)
        self.handle_signals = handle_signals
        self.stop_after_batches = stop_after_batches
        self._stop = threading.Event()
        self._in_batch = threading.Lock()
        self._failure: BaseException | None = None
        self._reports: dict[int, Any] = {}
        self._batches_done = 0
        self._spark: Any = None
        observers = list(pipeline.observers)
        if not any(isinstance(o, BatchHistory) for o in observers):
            # Where each batch's time went and what it wrote, kept for the status page.
            observers.append(BatchHistory(self.layout))
        self._observers = SafeObservers(observers)
        self._backend: Any = None
        self._log_file: str | None = None
        self._running: tuple[int, float] | None = None
        self._phase: str | None = None  # "tables" while the session tables are written
        self._live: LiveProgress | None = None
        self._planned: tuple[int, int | None] = (-1, None)
        self._lease: CheckpointLease | None = None

    # -- paths -------------------------------------------------------------------------------

    @property
    def checkpoint(self) -> str:
        """The checkpoint root as a string."""
        return self.layout.root

    @cached_property
    def layout(self) -> CheckpointLayout:
        """The checkpoint's layout: every path below the root comes from it (the checkpoint
        stays the same when a repair's resume or initial state replace the pipeline)."""
        return self.pipeline.checkpoint_layout()

    # -- building ----------------------------------------------------------------------------

    def _make_backend(self) -> Any:
        p = self.pipeline
        if p.backend not in ("partition", "spark"):
            raise ConfigError(f"backend {p.backend!r} is not available; use 'partition' or 'spark'")
        from inorder.engine.partition import PartitionBackend
        from inorder.engine.spark_backend import SparkBackend
        from inorder.state.store import StateOptions

        backend_class = SparkBackend if p.backend == "spark" else PartitionBackend
        return backend_class(
            p.processor,
            p.resolved_codec(),
            p.resolved_integrity(),
            checkpoint=self.layout.engine_dir,
            sink=p.sink,
            dead_letter_sink=p.dead_letter,
            state_options=StateOptions(delta_files=p.state_deltas),
        )

    def _trigger_kwargs(self) -> dict[str, Any]:
        return trigger_kwargs(self.pipeline.trigger)

    def _reads_in_tasks(self) -> bool:
        """Whether the engine's tasks read Kafka themselves (the source only plans ranges).

        The partition backend does, saving the records' trip through Spark's JVM; the spark
        backend needs the rows in Spark for its shuffle, and a source reading through an
        archive reads the archived offsets itself.
        """
        p = self.pipeline
        return p.backend == "partition" and not p.source.reads_archive

    def _worker_pools(self) -> tuple[str | None, ...]:
        """The Python worker pools the batches use (spark/worker_pools.py)."""
        if self.pipeline.backend != "partition":
            return (None,)
        from inorder.spark.worker_pools import ENGINE_POOL, SOURCE_POOL

        return (SOURCE_POOL if self._reads_in_tasks() else None, ENGINE_POOL)

    def _source_options(self) -> dict[str, str]:
        options = {"inorder.partitionMarkers": "true"}
        highs = self.layout.source_highs_file
        if highs is not None:
            options["inorder.highWatermarksFile"] = highs
        if self._reads_in_tasks():
            options["inorder.rangesOnly"] = "true"
            tasks = default_parallelism(self._spark)
            if tasks:
                # One input partition per task the backend runs anyway: Spark's Python
                # source costs a worker round trip per input partition (~40 ms each).
                options["inorder.rangeGroups"] = str(tasks)
        tick = self.pipeline.tick_interval
        if tick is not None and "processingTime" in self._trigger_kwargs():
            options["inorder.tickIntervalMs"] = str(int(tick.total_seconds() * 1000))
        return options

    # -- the batch function (runs on the driver, called by Spark per micro-batch) ------------

    def _on_batch(self, df: Any, batch_id: int) -> None:
        if self._stop.is_set():
            self._quiet_spark()
            raise _StopRequested()
        with self._in_batch:
            self._running = (batch_id, time.monotonic())
            try:
                report = self._backend.run_batch(df, batch_id)
            except BaseException as exc:
                self._failure = exc
                self._quiet_spark()
                raise
            finally:
                self._running = self._phase = None
                if self._live is not None:
                    self._live.forget(batch_id)
            self._reports[batch_id] = report
            self._batches_done += 1
            if self.stop_after_batches is not None and (
                self._batches_done >= self.stop_after_batches
            ):
                self._stop.set()

    def _enter_phase(self, phase: str | None) -> None:
        self._phase = phase

    def _quiet_spark(self) -> None:
        # Spark logs the failing query with a JVM stack trace at ERROR level; the runner
        # reports the cause itself, in one line.
        if self._spark is not None:
            self._spark.sparkContext.setLogLevel("OFF")

    # -- running -----------------------------------------------------------------------------

    def run(self) -> RunSummary:
        """Start the query, report progress, stop on signal or completion; return a summary."""
        self.layout.write_probe()  # a remote one is checked when the backend opens its store
        layout = self.layout
        self._log_file = layout.run_log_file(self.pipeline.name)
        given = self.pipeline.lease_duration
        duration = given.total_seconds() if given else DEFAULT_DURATION
        with layout.run_lock():
            # The lease refuses a second driver (also on an object store, where there is no
            # lock) and fences every commit of this one (BatchCommit.fence).
            self._lease = layout.lease(
                duration, lambda line: self.reporter.info(f"inorder: {line}")
            )
            # Holding the local run lock proves the lease's last holder is gone: no wait.
            self._lease.acquire(holder_gone=layout.local_root is not None)
            try:
                self._lease.start_renewing(self._on_lease_lost)
                return self._run()
            finally:
                self._lease.release()

    def _session_options(self) -> dict[str, Any]:
        p = self.pipeline
        return {
            "master": p.spark_master,
            "app_name": p.name,
            "conf": dict(p.spark_conf),
            "log_file": self._log_file,
        }

    def _sinks(self) -> list[Sink]:  # what the run commits to: the output, the dead letters
        return [s for s in (self.pipeline.sink, self.pipeline.dead_letter) if s is not None]

    def _on_lease_lost(self, exc: InorderError) -> None:
        # Another driver has the checkpoint: stop between batches; the run fails with `exc`.
        self._failure = exc
        self._stop.set()

    def _run(self) -> RunSummary:
        from inorder.pipeline.spark import build_spark_session, warm_python_workers

        started = time.monotonic()
        from inorder.archive.initial_state import seed_if_needed

        # Settings that would run "fine" and quietly do the wrong thing: refused first.
        check_fits(self.pipeline.resolved_integrity(), self.pipeline.processor)

        # Job version (sink wrapper), initial state (starting offsets) when configured, and
        # what `inorder repair` left in the checkpoint (batch id offset, starting offsets).
        self.pipeline, seeding = prepare_run(self.pipeline, self.layout)
        p = self.pipeline
        summary = RunSummary(
            output=p.sink.describe(),
            policy=p.resolved_integrity().on_violation,
            dead_letter_output=p.dead_letter.describe() if p.dead_letter is not None else "",
        )
        if p.dead_letter is None and p.dead_letters_possible():
            raise ConfigError(
                f"the dead_letter policy needs a place for dead letters, and {p.sink.describe()} "
                "has no path to put them beside; give one with Pipeline(dead_letter=...) or "
                "[dead_letter] path"
            )
        trigger = self._trigger_kwargs()
        # Everything that can be wrong is checked before Spark starts: broker, options,
        # output types, state compatibility, sink.
        # A run that reads what is there now and ends refuses a pattern matching nothing.
        bounded = "processingTime" not in trigger
        source_notes = p.source.check(self._source_options(), bounded=bounded)
        layout = self.layout
        owner = layout.ensure_owner()
        settings = self.settings or RecordedSettings.of("python", None)
        for note in claim_checkpoint(self.pipeline, layout, settings, self.accept_changes):
            self.reporter.info(f"inorder: {note}")
        p.sink.bind(owner)
        if p.dead_letter is not None:
            p.dead_letter.bind(owner)
        if seeding and p.backend == "spark":
            raise ConfigError(
                "initial_state needs backend = 'partition': the spark backend keeps state in "
                "Spark's state store, which inorder cannot seed"
            )
        self._backend = self._make_backend()
        commit = self._backend.batch_commit
        if self._lease is not None:
            commit.fence = self._lease.check
            guard_sinks(self._sinks(), self._lease)  # their compactor threads commit too
        try:
            self._backend.check()
        except InorderError as exc:
            # Anything found before the first batch is a setup problem: exit code 2.
            raise ConfigError(str(exc)) from None
        seed_if_needed(self._backend, p, seeding)
        commit.hooks = after_commit_hooks(p)
        commit.on_phase = self._enter_phase
        self.reporter.info(f"inorder: starting {p.name!r} on {p.spark_master}, {p.sink.describe()}")
        for note in source_notes:  # after every check: a refused start stays one line
            self.reporter.info(f"inorder: {note}")
        options = self._session_options()
        if self._early is not None:
            self._spark = self._early.session()  # waits for it; its failure is this run's
        if self._early is None or self._early.options != options:
            self._spark = build_spark_session(**options)
        warm_python_workers(self._spark, p.spark_master, self._worker_pools())
        if p.backend == "partition":  # its tasks report records applied while they run
            self._live = LiveProgress.on_driver(self._spark)
            self._backend.progress_to = None if self._live is None else self._live.address
        self._observers.on_start()
        restore = self._install_signal_handlers()
        printed: set[int] = set()
        try:
            for start in range(1, QUERY_STARTS + 1):
                last = start == QUERY_STARTS
                try:
                    query = self._start_query(trigger)
                except Exception as exc:  # a planner process (Py4J error) that did not start
                    if last or not slow_python_start(str(exc)):
                        raise
                    self._note_restart(start)
                    continue
                self._watch(query, printed, summary)
                if last or not self._failed_by_slow_python_start(query):
                    break
                self._report_progress(query, printed, summary)  # its batches before the end
                self._note_restart(start)
        finally:
            restore()
            if self._live is not None:
                self._live.close()
            finish_sinks(self._sinks(), self.reporter.info)
        self._report_progress(query, printed, summary)
        summary.seconds = time.monotonic() - started
        try:
            self._raise_failure(query)
        except InorderError as exc:
            self._observers.on_failure(exc)
            self._observers.on_stop()
            raise
        self._observers.on_stop()
        if not summary.stopped_because:
            if self._stop.is_set():
                summary.stopped_because = "stop requested"
            else:
                summary.stopped_because = (
                    "caught up" if "processingTime" not in trigger else "ended"
                )
        if self._spark is not None:
            self._spark.sparkContext.setLogLevel("ERROR")
        self.reporter.summary(summary)
        return summary

    def _start_query(self, trigger: dict[str, Any]) -> Any:
        """Load the source and start the streaming query (from the checkpoint, if any)."""
        p = self.pipeline
        extra = self._source_options()
        df = p.source.load(self._spark, extra_options=extra)
        if self._reads_in_tasks():
            from inorder.kafka.options import parse_options

            self._backend.source_options = parse_options({**p.source.to_options(), **extra})
            from inorder.engine.plan_coverage import planned_ranges

            self._backend.planned_ranges = functools.partial(
                planned_ranges, self.layout.spark_log.source_offset
            )
        prepare = getattr(self._backend, "prepare_stream", None)
        if prepare is not None:  # e.g. the spark backend's keyed stage (transformWithState)
            df = prepare(df)
        return (
            df.writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", self.layout.spark_dir)
            .queryName(p.name)
            .trigger(**trigger)
            .start()
        )

    def _watch(self, query: Any, printed: set[int], summary: RunSummary) -> None:
        """Report progress until the query ends (done, failed or stopped on request)."""
        while query.isActive:
            try:
                query.awaitTermination(0.5)
            except Exception:  # the query failed: _raise_failure reports why
                break
            self._report_progress(query, printed, summary)
            self._report_running()
            if self._stop.is_set() and query.isActive:
                with self._in_batch:
                    self._quiet_spark()
                    query.stop()
                    summary.stopped_because = "stop requested"

    def _failed_by_slow_python_start(self, query: Any) -> bool:
        """Whether the query ended only because a Python process of Spark's started late."""
        if self._stop.is_set() or isinstance(self._failure, InorderError):
            return False
        failure = self._failure if self._failure is not None else query.exception()
        return failure is not None and slow_python_start(str(failure))

    def _note_restart(self, start: int) -> None:
        self._failure = None
        if self._spark is not None:
            self._spark.sparkContext.setLogLevel("ERROR")  # _quiet_spark turned it off
        self.reporter.info(
            f"inorder: {SLOW_PYTHON_START_NOTE} (start {start + 1} of {QUERY_STARTS})"
        )

    def _raise_failure(self, query: Any) -> None:
        failure = self._failure
        if failure is not None and not isinstance(failure, _StopRequested):
            # A sink's commit meeting a full disk is named like any other refused write; any
            # other inorder error is raised as it is.
            raise explain_exception(failure, self.checkpoint, self._log_file) from None
        if self._stop.is_set():
            return
        exc = query.exception()
        if exc is not None:
            raise explain_failure(str(exc), self.checkpoint, self._log_file) from None

    def _report_progress(self, query: Any, printed: set[int], summary: RunSummary) -> None:
        waiting = list(self._reports)  # batches committed, their lines not printed yet
        if not waiting:
            return
        # Spark's recentProgress parses its last 100 progress documents, each with the
        # offsets of every topic-partition: polled twice a second, at 1,000 topics that was a
        # third of the driver's CPU (measured). The last one is enough for one waiting batch.
        last = query.lastProgress if len(waiting) == 1 else None
        recent = [last] if last is not None else query.recentProgress
        for progress in recent:
            data = progress if isinstance(progress, dict) else progress_dict(progress)
            batch_id = int(data.get("batchId", -1))
            if batch_id in printed or "addBatch" not in data.get("durationMs", {}):
                continue  # printed, or an idle trigger's progress: no batch ran
            report = self._reports.pop(batch_id, None)  # reported once: a long run keeps none
            if report is None:
                continue
            printed.add(batch_id)
            # A batch re-run after a restart has no lag from Spark: the broker tells it.
            lags = batch_lag(data, getattr(self.pipeline.source, "to_options", None))
            line = batch_progress(batch_id, report, data, lags)
            summary.add(line)
            self.reporter.batch(line)
            self._observers.on_batch(line, lags)

    def _report_running(self) -> None:
        """Show a batch that is still running (a long batch is not silence)."""
        running = self._running
        # Reporters written before `running` existed keep working without it.
        show = getattr(self.reporter, "running", None)
        if running is None or show is None:
            return
        batch_id, started = running
        done, total = task_counts(self._spark)
        if self._planned[0] != batch_id:
            self._planned = (batch_id, planned_records(self.layout, batch_id))
        applied = None if self._live is None else self._live.applied(batch_id)
        seconds = time.monotonic() - started
        show(RunningBatch(batch_id, seconds, done, total, self._planned[1], applied, self._phase))

    def stop(self) -> None:
        """Ask the run to stop after the current micro-batch (from any thread)."""
        self._stop.set()

    def _install_signal_handlers(self) -> Callable[[], None]:
        if not self.handle_signals:
            return lambda: None
        return install_stop_signals(
            self.stop,
            self._stop.is_set,
            lambda: None if self._running is None else self._running[0],
            self.reporter.info,
        )
