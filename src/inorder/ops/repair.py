"""``inorder repair``: roll a pipeline's output and checkpoint back to clean session starts.

The procedure (docs/operations.md, "Repair"), per topic-partition:

1. **Failure point** ``F``: the end of the last batch Spark committed (default), an explicit
   ``--at-offset``, the first offset at ``--at-time``, or the first record the processor
   stops at (a ``fail``-policy violation found while scanning). Nothing at or after ``F``
   is trusted.
2. **Clean restart offset** ``R <= F``: the partition is applied from its start with the
   pipeline's own processor (the engine's apply core, plain Python, chunk by chunk) while
   :class:`~inorder.ops.sessionspans.SpanTracker` records each key's lifetime. ``R`` is the
   latest offset no lifetime straddles: every session live there restarts from its own
   start (a snapshot: ``processor.starts_session``), so empty state at ``R`` reproduces the
   original output. ``--session S`` also moves ``R`` to or before ``S``'s latest start.
3. **Output**: rows at offsets ``>= R`` are deleted (:mod:`inorder.ops.repair_output`).
4. **Checkpoint**: moved to ``<checkpoint>.bak-<UTC time>`` (local or S3 alike: on S3 each
   object is copied, :meth:`~inorder.checkpoint.layout.CheckpointLayout.move_to`); a fresh
   one holds only
   ``inorder-checkpoint.json`` with the *same* owner id (the sink keeps accepting it),
   ``batch_offset`` = the sink's last committed batch + 1 (its batch ids continue the
   sink's numbering: :class:`~inorder.sinks.offset_ids.BatchIdOffset`) and
   ``startingOffsets`` = ``R`` per partition (the next ``inorder run`` starts there).

Planning changes nothing. Applying marks the old checkpoint ``repair_pending`` first (``inorder
run`` refuses it), so a crash at any step is finished by running the repair again, which
recomputes the same plan and skips what is done; a repair applied twice finds nothing to do.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from inorder.checkpoint.info import CheckpointInfo
from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.names import CHECKPOINT_FILE, REPAIR_NEW_SUFFIX
from inorder.errors import ConfigError, InorderError
from inorder.kafka.offsets import EARLIEST, LATEST
from inorder.ops.batchlog import load_batch_log
from inorder.ops.kafka_reads import offsets_for_time, partitions, watermarks
from inorder.ops.repair_output import count_rows, delete_rows
from inorder.ops.repair_plan import PartitionRepair, RepairPlan
from inorder.ops.repair_scan import scan_partition
from inorder.ops.target import OpsTarget
from inorder.pipeline.resume import resume_overrides  # noqa: F401 (its earlier home)
from inorder.records import TopicPartition

CHECKPOINT_INFO = CHECKPOINT_FILE
NEW_SUFFIX = REPAIR_NEW_SUFFIX


# -- the checkpoint -------------------------------------------------------------------------------


def _finish_swap(layout: CheckpointLayout) -> bool:
    """A crash between moving the old checkpoint away and the new one in: finish it."""
    staged = layout.staged()
    if not layout.exists() and staged.exists():
        staged.move_to(layout)
        return True
    return False


def _spark_batches(layout: CheckpointLayout) -> int:
    try:
        return len(layout.planned_batches())
    except (OSError, InorderError):
        return 0


# -- planning -------------------------------------------------------------------------------


def _owner(target: OpsTarget, info: CheckpointInfo | None) -> str:
    """The checkpoint id the output was written by: kept, so the sink accepts the new one."""
    if info is not None and info.id:
        return info.id
    from inorder.ops.output import sink_kind

    sink: Any = target.sink
    if sink.last_committed_batch() is None:
        return uuid.uuid4().hex  # nothing committed: any id will do
    if sink_kind(sink) == "parquet":
        from inorder.sinks.parquet import COMMITS_DIR, manifest_name, read_manifest

        rel = f"{COMMITS_DIR}/{manifest_name(sink.last_committed_batch())}"
        owner = read_manifest(sink.location, rel).get("owner")
        if owner:
            return str(owner)
    elif getattr(sink, "_explicit_app_id", False):
        return uuid.uuid4().hex  # batch ids are keyed by the explicit app_id
    raise InorderError(
        f"checkpoint {target.checkpoint_root}: {CHECKPOINT_INFO} is missing and the output "
        "does not name the checkpoint that wrote it; restore the checkpoint's "
        f"{CHECKPOINT_INFO} (or give the Delta sink an explicit app_id)"
    )


def _last_batch(sink: Any) -> int | None:
    last = sink.last_committed_batch()
    return None if last is None else int(last)


def _validate_failures(
    target: OpsTarget, given: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Per partition whose output differs from a recomputation: its first differing offset."""
    from inorder.ops.validate import validate

    out: dict[TopicPartition, int] = {}
    for diff in validate(target).partitions:
        if diff.ok or diff.first_offset is None:
            continue
        tp = TopicPartition(diff.topic, diff.partition)
        out[tp] = min(diff.first_offset, given.get(tp, diff.first_offset))
    return out


def _per_partition(data: Mapping[str, Mapping[str, Any]]) -> dict[TopicPartition, int]:
    return {
        TopicPartition(topic, int(part)): int(pos)
        for topic, parts in data.items()
        for part, pos in parts.items()
    }


def _initial_offset(target: OpsTarget, tp: TopicPartition, low: int) -> int:
    opts = target.source_options
    if opts.starting_offsets == "json":
        given = opts.starting_positions.get(tp)
        if given is not None and given >= 0:
            return max(given, low)
    return low


def _unconsumed_start(target: OpsTarget, had_checkpoint: bool) -> int:
    """Where a partition no batch read starts: as the source would start it."""
    opts = target.source_options
    how = opts.new_topic_starting_offsets if had_checkpoint else opts.starting_offsets
    return LATEST if how == "latest" else EARLIEST


def plan_repair(
    target: OpsTarget,
    at_offsets: Mapping[TopicPartition, int] | None = None,
    at_time_ms: int | None = None,
    session: str | None = None,
    use_validate: bool = False,
) -> RepairPlan:
    """Work out the repair; changes nothing (except finishing a crashed repair's last step).

    ``use_validate`` first runs :func:`inorder.ops.validate.validate`: each partition whose
    output differs from the recomputation fails at its first differing offset.
    """
    layout = target.layout
    notes: list[str] = []
    if use_validate:
        at_offsets = dict(at_offsets or {})
        at_offsets.update(_validate_failures(target, at_offsets))
    if _finish_swap(layout):
        notes.append("finished a repair that stopped before its new checkpoint was in place")
    info = layout.info()
    owner = _owner(target, info)
    sinks: list[tuple[str, Any]] = [("output", target.sink)]
    if target.pipeline.dead_letter is not None:
        sinks.append(("dead-letter", target.pipeline.dead_letter))
    for _, sink in sinks:
        sink.bind(owner)
    lasts = [b for b in (_last_batch(s) for _, s in sinks) if b is not None]
    old_offset = info.offset if info is not None else 0
    batch_offset = max(lasts) + 1 if lasts else old_offset
    plan = RepairPlan(
        target.pipeline.name, layout.local_root or layout.root, owner, batch_offset, notes=notes
    )

    try:
        log = load_batch_log(layout, target.engine)
    except Exception:  # a damaged engine directory: batch times unknown, boundaries still used
        log = load_batch_log(layout)
    last = log.last_committed()
    fresh_starts: dict[TopicPartition, int] = {}
    fresh_failures: dict[TopicPartition, int] = {}
    if info is not None and info.starting_offsets and not log.batches:
        # A repaired checkpoint that has not run: its plan's failure points still hold, so
        # planning again gives the same plan (and finds nothing left to do).
        fresh_starts = _per_partition(info.starting_offsets)
        fresh_failures = _per_partition(info.failure_points)

    from inorder.ops.output import OutputView

    out_parts = OutputView(target.sink).partitions()
    opts = target.source_options
    in_kafka = partitions(opts)
    tps = sorted(set(log.partitions()) | set(out_parts) | set(in_kafka) | set(fresh_starts))
    marks = watermarks(opts, tps)
    for_time = offsets_for_time(opts, list(marks), at_time_ms) if at_time_ms is not None else {}
    unknown = [str(tp) for tp in (at_offsets or {}) if tp not in marks]
    if unknown:
        raise ConfigError(f"--at-offset: {', '.join(unknown)} is not a partition of the pipeline")
    session_seen = False
    had_checkpoint = bool(log.batches) or bool(fresh_starts)
    explicit = bool(at_offsets) or at_time_ms is not None or session is not None
    for tp in tps:
        mark = marks.get(tp)
        if mark is None:
            notes.append(f"{tp} is in the output or checkpoint but not in Kafka: left as it is")
            continue
        if tp in fresh_starts and not explicit:
            # A repaired checkpoint that has not run yet: its plan stands (same result).
            start = fresh_starts[tp]
            failure_at = fresh_failures.get(tp, start) if start >= 0 else None
            plan.partitions.append(
                PartitionRepair(
                    tp.topic, tp.partition, failure_at, "planned by the last repair", start
                )
            )
            continue
        failure: int | None
        if last is not None and tp in last.end:
            failure, reason = last.end[tp], f"end of batch {last.batch_id}"
        elif tp in fresh_failures:
            failure, reason = fresh_failures[tp], "failure point of the last repair"
        elif fresh_starts.get(tp, -1) >= 0:
            failure, reason = fresh_starts[tp], "start of the repaired checkpoint"
        elif tp in out_parts:
            failure, reason = out_parts[tp][2] + 1, "after the last output row"
        else:
            failure, reason = None, "never consumed"
        if at_offsets and tp in at_offsets:
            failure = at_offsets[tp]
            reason = "first differing offset" if use_validate else "--at-offset"
        elif tp in for_time and failure is not None:
            at = for_time[tp]
            if at is not None and at < failure:
                failure, reason = at, "--at-time"
        if failure is None:
            start = fresh_starts.get(tp, _unconsumed_start(target, had_checkpoint))
            plan.partitions.append(PartitionRepair(tp.topic, tp.partition, None, reason, start))
            continue
        begin = _initial_offset(target, tp, mark.low)
        failure = max(begin, min(failure, mark.high))
        scan = scan_partition(target, tp, begin, failure, log if log.batches else None, session)
        if scan.failed is not None and scan.failed.offset < failure:
            failure, reason = scan.failed.offset, f"stops there: {scan.failed.message()}"
        bound = failure
        watched = scan.tracker.latest_start(session) if session is not None else None
        if watched is not None:
            session_seen = True
            if watched < bound:
                bound = watched
        cut = scan.tracker.cut(bound)
        plan.partitions.append(
            PartitionRepair(
                tp.topic,
                tp.partition,
                failure,
                reason,
                cut.offset,
                cut.key,
                cut.open_keys,
                scan.records,
            )
        )
    if session is not None and not session_seen:
        raise ConfigError(f"--session: session {session!r} was not found before the failure point")

    starts = plan.delete_from()
    plan.outputs = [count_rows(name, sink, starts) for name, sink in sinks]
    plan.tables_from_batch, plan.tables = _tables_rollback(target, starts)
    by_tp = plan.outputs[0].rows_by_partition
    for p in plan.partitions:
        p.rows_to_delete = by_tp.get(str(p.tp), 0)
    plan.nothing_to_do = (
        info is not None
        and not log.batches
        and _spark_batches(layout) == 0
        and info.repair_pending is None
        and info.starting_offsets == plan.starting_offsets()
        and info.offset == plan.batch_offset
        and all(o.rows == 0 for o in plan.outputs)
        and not any(t.needed for t in plan.tables)
    )
    if not plan.nothing_to_do and layout.exists():
        plan.backup = layout.backup(datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")).root
    return plan


def _tables_rollback(
    target: OpsTarget, starts: Mapping[TopicPartition, int]
) -> tuple[int | None, list[Any]]:
    """The session tables' first rolled-back batch (the least batch of the change rows the
    repair deletes) and what restoring each table to before it does; nothing without tables."""
    from inorder.sessions.tables_ops import ops_writer, restore_plan

    writer = ops_writer(target.pipeline)
    if writer is None:
        return None, []
    from inorder.ops.output import OutputView

    view = OutputView(target.sink)
    firsts = []
    for tp, start in sorted(starts.items()):
        rows = view.read(tp, start=start, columns=["offset", "batch_id"])
        if rows.num_rows:
            firsts.append(int(min(rows.column("batch_id").to_pylist())))
    if not firsts:
        return None, []
    return min(firsts), restore_plan(writer, min(firsts))


# -- applying ------------------------------------------------------------------------------------


def apply_repair(target: OpsTarget, plan: RepairPlan) -> RepairPlan:
    """Perform ``plan``: mark, delete output rows, back up and replace the checkpoint."""
    if plan.nothing_to_do:
        return plan
    layout = target.layout
    info = layout.info()
    if info is not None:
        # From here until the new checkpoint is in place `inorder run` refuses to start.
        layout.write_info(replace(info, repair_pending=plan.to_json()))
    sinks: list[tuple[str, Any]] = [("output", target.sink)]
    if target.pipeline.dead_letter is not None:
        sinks.append(("dead-letter", target.pipeline.dead_letter))
    starts = plan.delete_from()
    if plan.tables_from_batch is not None:
        from inorder.sessions.tables_ops import ops_writer, restore_tables

        writer = ops_writer(target.pipeline)
        if writer is not None:
            # Before the change rows go: a repair run again after a crash here finds the
            # same first rolled-back batch in them (a restored table is left alone).
            restore_tables(writer, plan.tables_from_batch)
    plan.outputs = [delete_rows(name, sink, starts) for name, sink in sinks]
    # The backup is a sibling the layout named (a path it made, not one given by a user).
    if plan.backup is not None and CheckpointLayout(plan.backup).exists():
        plan.backup = f"{plan.backup}-{uuid.uuid4().hex[:6]}"
    staged = layout.staged()
    staged.remove()
    # The repaired checkpoint belongs to the same pipeline: keep what identifies it.
    kept = info.pipeline_part() if info is not None else CheckpointInfo()
    staged.write_info(plan.checkpoint_info(kept))
    if layout.exists():
        assert plan.backup is not None
        layout.move_to(CheckpointLayout(plan.backup))
    staged.move_to(layout)
    plan.applied = True
    return plan


def parse_at_offset(text: str) -> tuple[TopicPartition, int]:
    """``TOPIC:PARTITION:OFFSET`` (the topic may contain ``:``)."""
    topic, sep, rest = text.rpartition(":")
    topic2, sep2, part = topic.rpartition(":")
    if not sep or not sep2 or not topic2:
        raise ConfigError(f"--at-offset: expected TOPIC:PARTITION:OFFSET, not {text!r}")
    try:
        return TopicPartition(topic2, int(part)), int(rest)
    except ValueError:
        raise ConfigError(
            f"--at-offset: partition and offset must be numbers in {text!r}"
        ) from None
