"""``inspect``: what a pipeline's checkpoint says, read-only.

* batches: id, per topic-partition offset range (Spark offsets log), planned/committed
  times and duration (the log files' modification times), processing time (engine record);
* state: per topic-partition the newest committed state version, keys, encoded state bytes
  and checkpoint file bytes;
* one key: its state (decoded with the processor's state type) at a given batch version;
* an Iceberg output: its snapshots with their batch ids and offset ranges;
* session tables (``[tables]``): each table's last batch and the offsets its newest commits
  hold.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.state_files import load_partition_state, loadable_versions
from inorder.engine.context import from_micros
from inorder.errors import InorderError
from inorder.ops.batchlog import BatchEntry, BatchLog, load_batch_log
from inorder.ops.inspect_text import STATE_LISTED, format_inspect
from inorder.ops.output_files import output_files
from inorder.ops.replay import to_plain
from inorder.ops.target import OpsTarget
from inorder.pids import process_alive
from inorder.pipeline.batch_history import read_history
from inorder.records import TopicPartition
from inorder.state.checkpoint import VersionFile, parse_version_file

__all__ = [
    "BatchInfo",
    "PartitionStateInfo",
    "batches",
    "format_inspect",
    "inspect_all",
    "key_state",
    "state_sizes",
]


@dataclass
class BatchInfo:
    """One batch as shown by ``inspect --batches``."""

    batch_id: int
    committed: bool
    ranges: dict[str, list[int]]
    records_planned: int
    planned_at: str | None
    duration_seconds: float | None
    """The batch's own time: its recorded progress line's, else from planning to Spark's
    commit; ``None`` when a run started in between and nothing measured the batch."""
    processing_time: str | None
    restarted: bool = False
    """Planned by one run, committed by a later one (re-run after a stop or a crash)."""


@dataclass
class PartitionStateInfo:
    """State size of one topic-partition.

    ``loaded`` is false when only the checkpoint's file listing was read (many partitions,
    no ``--all``): ``keys``, ``ignored_keys`` and ``state_bytes`` are then ``None``, unknown.
    """

    topic: str
    partition: int
    version: int | None
    keys: int | None
    ignored_keys: int | None
    state_bytes: int | None
    file_bytes: int
    versions: list[int] = field(default_factory=list)
    last_offset: int | None = None
    loaded: bool = True


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def run_started_at(layout: CheckpointLayout) -> float | None:
    """When the newest run of a local checkpoint started (it rewrites the run lock file)."""
    path = layout.run_lock_file
    if path is None:
        return None
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def running_run(layout: CheckpointLayout) -> str | None:
    """Who runs the pipeline now (its lease, held and unexpired), or ``None``.

    A run killed on this host leaves its lease until it expires: its pid, gone, says so.
    """
    try:
        holder = layout.lease().current_holder()
    except InorderError:
        return None  # a damaged lease: the run that finds it says so
    if holder is None:
        return None
    pid, _, host = holder.holder.removeprefix("pid ").partition(" on ")
    if host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid)):
        return None
    return holder.describe()


def _duration(b: BatchEntry, recorded: Mapping[str, Any] | None, restarted: bool) -> float | None:
    """A batch's own time. Planning to commit spans the pause when a run stopped after
    planning it and a later run committed it (minutes, days): only a measured duration
    (the progress line the run recorded) is then true."""
    if recorded is not None and isinstance(recorded.get("duration_seconds"), (int, float)):
        return round(float(recorded["duration_seconds"]), 3)
    if restarted or b.duration_seconds is None:
        return None
    return round(b.duration_seconds, 3)


def batches(
    log: BatchLog,
    limit: int | None = None,
    history: Mapping[int, Mapping[str, Any]] | None = None,
    run_started: float | None = None,
) -> list[BatchInfo]:
    """The batches of the log (newest ``limit`` when given), oldest first.

    ``history`` holds the recorded progress lines by batch id (their durations are the
    measured ones); ``run_started`` is when the newest run started: a batch planned before
    it and committed after it was re-run by that run.
    """
    history = history or {}
    out: list[BatchInfo] = []
    previous: dict[TopicPartition, int] = {}
    for i, b in enumerate(log.batches):
        # Where a range began, as the source planned it (kafka.planning.plan_ranges): the
        # recorded start of a partition entering with records, else the previous batch's
        # end, else (entering with nothing to read) its own end. Only the first batch left
        # in a truncated log has no previous batch to tell.
        known_previous = i > 0 or log.complete
        ranges = {}
        planned = 0
        for tp in sorted(b.end):
            if tp in b.starts:
                start: int | None = b.starts[tp]
            elif tp in previous or known_previous:
                start = previous.get(tp, b.end[tp])
            else:
                start = None
            ranges[str(tp)] = [start if start is not None else -1, b.end[tp]]
            if start is not None:
                planned += max(0, b.end[tp] - start)
        restarted = (
            run_started is not None
            and b.planned_at is not None
            and b.planned_at < run_started
            and (b.committed_at is None or b.committed_at > run_started)
        )
        out.append(
            BatchInfo(
                b.batch_id,
                b.committed,
                ranges,
                planned,
                _iso(b.planned_at),
                _duration(b, history.get(b.batch_id), restarted and b.committed),
                None
                if b.processing_time_us is None
                else from_micros(b.processing_time_us).isoformat(timespec="seconds"),
                restarted,
            )
        )
        previous = b.end
    return out[-limit:] if limit else out


def state_files(target: OpsTarget) -> dict[TopicPartition, tuple[list[VersionFile], int]]:
    """Per topic-partition with state: its version files and their bytes (one listing)."""
    from inorder.state.task_deltas import DELTAS_DIR
    from inorder.storage.fs import list_files

    store = target.engine
    root = store.path("state").rstrip("/")
    found: dict[TopicPartition, tuple[list[VersionFile], int]] = {}
    for info in list_files(store.location, root, recursive=True):
        rel = info.path[len(root) :].strip("/").split("/")
        if len(rel) != 3 or not rel[1].isdigit():
            continue
        tp = TopicPartition(rel[0], int(rel[1]))
        files, size = found.get(tp, ([], 0))
        file = parse_version_file(rel[2], info.path)
        if file is not None:
            files.append(file)
            size += int(info.size or 0)
        found[tp] = (files, size)
    # Task files (state format 3): each partition's slices, their bytes shared by rows.
    deltas = root + "/" + DELTAS_DIR + "/"
    sizes = {i.path: int(i.size or 0) for i in list_files(store.location, deltas.rstrip("/"))}
    listed = store.task_files()
    for task_file in listed.files:
        index = listed.index(task_file)
        rows = sum(p.rows for p in index.parts.values()) or 1
        for (topic, partition), piece in index.parts.items():
            tp = TopicPartition(topic, partition)
            files, size = found.get(tp, ([], 0))
            files.append(
                VersionFile(
                    task_file.version,
                    "delta",
                    task_file.path,
                    task_file.attempt,
                    (topic, partition),
                )
            )
            found[tp] = (files, size + sizes.get(task_file.path, 0) * piece.rows // rows)
    for files, _ in found.values():
        files.sort(key=lambda f: (f.version, f.kind != "delta"))
    return dict(sorted(found.items()))


def state_sizes(
    target: OpsTarget,
    log: BatchLog,
    load: bool | None = True,
    only: Callable[[TopicPartition], bool] | None = None,
    load_max: int = STATE_LISTED,
) -> list[PartitionStateInfo]:
    """Per topic-partition: keys and bytes at the newest committed, loadable version.

    ``load=False`` reads the file listing only (versions and file bytes, no state file
    opened): keys and state bytes are then unknown; ``None`` loads the state of at most
    ``load_max`` partitions, else none. ``only`` selects topic-partitions.
    """
    last = log.last_committed()
    out = []
    selected = {tp: v for tp, v in state_files(target).items() if only is None or only(tp)}
    if load is None:
        load = len(selected) <= load_max
    for tp, (files, file_bytes) in selected.items():
        versions = loadable_versions(files)
        if last is not None:
            versions = [v for v in versions if v <= last.batch_id]
        if not versions:
            out.append(PartitionStateInfo(tp.topic, tp.partition, None, 0, 0, 0, file_bytes))
            continue
        if not load:
            out.append(
                PartitionStateInfo(
                    tp.topic, tp.partition, versions[-1], None, None, None, file_bytes,
                    versions, loaded=False,
                )
            )  # fmt: skip
            continue
        state = load_partition_state(target.engine, tp, versions[-1])
        out.append(
            PartitionStateInfo(
                tp.topic,
                tp.partition,
                state.version,
                sum(1 for e in state.entries.values() if not e.ignored),
                sum(1 for e in state.entries.values() if e.ignored),
                state.state_bytes,
                file_bytes,
                versions,
                state.meta.last_offset,
            )
        )
    return out


def key_state(
    target: OpsTarget, tp: TopicPartition, key: str, version: int | None, log: BatchLog
) -> dict[str, Any]:
    """The stored entry of ``key`` after batch ``version`` (default: newest committed)."""
    from inorder.state.codec import StateCodec

    versions = loadable_versions(target.engine.versions(tp))
    if version is None:
        last = log.last_committed()
        fitting = [v for v in versions if last is None or v <= last.batch_id]
        if not fitting:
            raise InorderError(f"no committed state version of {tp} in the checkpoint")
        version = fitting[-1]
    state = load_partition_state(target.engine, tp, version)
    stored = state.entries.get(key)
    result: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition, "key": key}
    result["version"] = version
    if stored is None:
        result["exists"] = False
        return result
    entry = stored.to_entry(StateCodec(target.types.state).decode)
    result.update(
        exists=True,
        state=to_plain(entry.state),
        ignored=entry.ignored,
        last_offset=entry.last_offset,
        seq=entry.seq,
        timer=None if entry.timer is None else from_micros(entry.timer).isoformat(),
        timer_kind=("processing" if entry.timer_kind == 0 else "event")
        if entry.timer is not None
        else None,
        state_bytes=len(stored.state or b""),
    )
    return result


def inspect_all(
    target: OpsTarget,
    want_batches: bool,
    want_state: bool,
    limit: int | None = 20,
    load_state: bool | None = True,
    only: Callable[[TopicPartition], bool] | None = None,
) -> dict[str, Any]:
    """Batches and/or state sizes as a JSON-ready document.

    ``load_state=False`` sizes the state from the checkpoint's file listing only (see
    :func:`state_sizes`); ``only`` selects the topic-partitions of the state section.
    """
    log = load_batch_log(target.layout, target.engine)
    doc: dict[str, Any] = {"checkpoint": target.checkpoint_root}
    last = log.last_committed()
    doc["last_committed_batch"] = None if last is None else last.batch_id
    # After `inorder repair` the output's batch ids are this checkpoint's plus an offset.
    doc["output_batch_offset"] = target.batch_offset
    if want_batches:
        # A run holding the lease now is applying the newest planned batch: "in flight".
        doc["running"] = running_run(target.layout)
        history = read_history(target.layout)
        started = run_started_at(target.layout)
        doc["batches"] = [asdict(b) for b in batches(log, limit, history, started)]
        files = output_files(target.sink)
        if files is not None:
            doc["output_files"] = asdict(files)
        snapshots = output_snapshots(target, limit)
        if snapshots is not None:
            doc["output_snapshots"] = snapshots
        tables = session_tables(target)
        if tables is not None:
            doc["tables"] = tables
    if want_state:
        doc["state"] = [asdict(s) for s in state_sizes(target, log, load_state, only)]
    return doc


def output_snapshots(target: OpsTarget, limit: int | None) -> list[dict[str, Any]] | None:
    """An Iceberg output's snapshots, oldest first (``None`` for other outputs)."""
    from inorder.sinks.iceberg import IcebergSink
    from inorder.sinks.iceberg_history import snapshot_history

    sink = target.sink
    if not isinstance(sink, IcebergSink):
        return None
    table = sink.load_table()
    return [] if table is None else [asdict(s) for s in snapshot_history(table, limit)]


def session_tables(target: OpsTarget) -> list[dict[str, Any]] | None:
    """The session tables' last batch and newest commits (``None`` without ``[tables]``)."""
    from inorder.sessions.tables_ops import ops_writer, table_status

    writer = ops_writer(target.pipeline)
    return None if writer is None else table_status(writer)
