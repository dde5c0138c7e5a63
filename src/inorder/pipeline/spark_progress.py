"""Spark's streaming progress, folded with the backend's batch report into inorder's own
progress line (:class:`~inorder.pipeline.progress.BatchProgress`): lag, timings, counts."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.spark_log import parse_offsets_entry
from inorder.errors import InorderError
from inorder.kafka.lag import counters_in_batch
from inorder.pipeline.progress import BatchProgress
from inorder.records import TopicPartition


def progress_dict(progress: Any) -> dict[str, Any]:
    """A ``StreamingQueryProgress`` (or its dict) as a plain dict."""
    raw = getattr(progress, "json", None)
    if callable(raw):
        import json

        loaded: dict[str, Any] = json.loads(raw())
        return loaded
    return dict(progress)


#: Steps the runner runs after the backend's batch, inside the same micro-batch (their
#: seconds are in the backend report's ``phase_seconds``): the batch lasts until they end.
AFTER_BACKEND = ("tables",)


def lag_by_partition(progress: dict[str, Any]) -> dict[str, int] | None:
    """Records not yet read, by ``topic[partition]``, from the source's progress metrics.

    ``None`` when unknown: a batch Spark re-runs from its offsets log after a restart was
    not planned by this run (its ``durationMs`` has no ``latestOffset`` step), and Spark
    then reports the batch's own end as the latest offset: a lag of 0 while a backlog
    remains.
    """
    from inorder.kafka.lag import lag_from_progress

    try:
        steps = progress.get("durationMs")
        if isinstance(steps, dict) and "latestOffset" not in steps:
            return None
        for source in progress.get("sources") or []:
            if source.get("endOffset") is not None and source.get("latestOffset") is None:
                return None
        return {str(tp): int(n) for tp, n in lag_from_progress(progress).items()}
    except Exception:  # lag is informative: never fail a run over it
        return None


#: Milliseconds the broker has to answer for the lag of a batch this run did not plan.
BROKER_LAG_TIMEOUT_MS = 2000


def batch_lag(
    progress: dict[str, Any], source_options: Callable[[], Mapping[str, str]] | None = None
) -> dict[str, int] | None:
    """The lag after a batch by ``topic[partition]``: Spark's (:func:`lag_by_partition`),
    or for a batch Spark re-ran after a restart, the broker's end offsets now minus the
    batch's end (``source_options`` gives the source's options; ``None`` when the broker
    does not answer for every partition of the batch: a part of the lag would read as all
    of it)."""
    measured = lag_by_partition(progress)
    if measured is not None or source_options is None:
        return measured
    from inorder.kafka.admin import KafkaAdmin
    from inorder.kafka.offsets import SourceOffset
    from inorder.kafka.options import parse_options

    try:
        ends: dict[TopicPartition, int] = {}
        for source in progress.get("sources") or []:
            end = source.get("endOffset")
            end = json.loads(end) if isinstance(end, str) else end
            if isinstance(end, dict) and "offsets" in end:  # an inorder-kafka source's
                ends.update(SourceOffset.from_dict(end).positions)
        if not ends:
            return None
        options = replace(
            parse_options(source_options()), metadata_timeout_ms=BROKER_LAG_TIMEOUT_MS
        )
        marks, failed = KafkaAdmin(options).watermarks(sorted(ends))
        if failed or set(marks) != set(ends):
            return None
        return {str(tp): max(0, marks[tp].high - end) for tp, end in sorted(ends.items())}
    except Exception:  # lag is informative: never fail a run over it
        return None


def batch_duration(report: Any, progress: dict[str, Any]) -> float:
    """Seconds the batch took: the backend's batch and the steps run after it (the session
    tables), or Spark's trigger time when the backend measured nothing."""
    phases = getattr(report, "phase_seconds", {}) or {}
    backend = float(getattr(report, "duration_seconds", 0.0))
    if backend > 0:
        return backend + sum(float(phases.get(step, 0.0)) for step in AFTER_BACKEND)
    return float((progress.get("durationMs") or {}).get("triggerExecution", 0)) / 1000.0


def batch_progress(
    batch_id: int,
    report: Any,
    progress: dict[str, Any],
    lag: Mapping[str, int] | Literal["spark"] | None = "spark",
) -> BatchProgress:
    """Combine the backend's batch report with Spark's progress into a progress line.

    ``lag``: the lag by partition when already known (:func:`batch_lag`); by default
    Spark's (:func:`lag_by_partition`).
    """
    duration = batch_duration(report, progress)
    lags = lag_by_partition(progress) if lag == "spark" else lag
    records = int(getattr(report, "records", 0))
    source = counters_in_batch(progress)
    return BatchProgress(
        batch_id=batch_id,
        records=records,
        records_per_second=records / duration if duration > 0 else 0.0,
        duration_seconds=duration,
        lag=None if lags is None else sum(lags.values()),
        state_keys=int(getattr(report, "state_keys", 0)),
        output_rows=int(getattr(report, "output_rows", 0)),
        output_files=int(getattr(report, "output_files", 0)),
        violations=dict(getattr(report, "violations_by_rule", {}) or {}),
        committed=bool(getattr(report, "committed", True)),
        violations_by_partition={
            partition: dict(counts)
            for partition, counts in (getattr(report, "violations_by_partition", {}) or {}).items()
        },
        seconds=_seconds(report, progress),
        state_opens=dict(getattr(report, "state_opens", {}) or {}),
        dead_letters=int(getattr(report, "dead_letters", 0)),
        ignored=int(getattr(report, "ignored", 0)),
        duplicates=int(getattr(report, "duplicates", 0)),
        # Lost offsets skipped when the batch was planned, and by its tasks while reading.
        skipped_lost=source["lostRecords"] + int(getattr(report, "skipped_lost", 0)),
        pruned_partitions=source["prunedPartitions"],
        ignored_by_partition={
            f"{p.topic}[{p.partition}]": p.counters["ignored"]
            for p in getattr(report, "partitions", ())
            if p.counters.get("ignored")
        },
    )


def _seconds(report: Any, progress: dict[str, Any]) -> dict[str, float]:
    seconds = {
        k: round(float(v), 4) for k, v in (getattr(report, "phase_seconds", {}) or {}).items()
    }
    for step, ms in (progress.get("durationMs") or {}).items():
        seconds[f"spark_{step}"] = float(ms) / 1000.0
    return seconds


def task_counts(spark: Any) -> tuple[int, int]:
    """Tasks done and in all of the stages running now (0, 0 when unknown)."""
    try:
        tracker = spark.sparkContext.statusTracker()
        done = total = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done += int(info.numCompletedTasks)
                total += int(info.numTasks)
        return done, total
    except Exception:  # progress is informative: never fail a run over it
        return 0, 0


def planned_records(layout: CheckpointLayout, batch_id: int) -> int | None:
    """Offsets a micro-batch covers, from Spark's offsets log."""
    from inorder.kafka.offsets import SourceOffset

    def offset_of(n: int) -> SourceOffset | None:
        try:
            entry = layout.offsets_entry(n)
            source = None if entry is None else parse_offsets_entry(entry)
            return None if source is None else SourceOffset.from_dict(source)
        except (OSError, ValueError, KeyError, InorderError):
            return None

    end = offset_of(batch_id)
    if end is None:
        return None
    start = offset_of(batch_id - 1) if batch_id > 0 else None
    before = dict(start.positions) if start is not None else {}
    total = 0
    for tp, position in end.positions.items():
        # Where the range began (kafka.planning.plan_ranges): a recorded start first.
        first = end.starts.get(tp, before.get(tp))
        if first is not None:
            total += max(0, position - first)
    return total


def default_parallelism(spark: Any) -> int:
    """The session's task slots (0 without a session or SparkContext, e.g. Spark Connect)."""
    if spark is None:
        return 0
    try:
        return max(int(spark.sparkContext.defaultParallelism), 0)
    except Exception:
        return 0
