"""One topic-partition inside a task of the partition backend: its state and applier, its
rows handed to the task's output, and the task's finish (drain, output, state commit).

A task of hundreds of topic-partitions with a few output rows each encodes their last rows
together (:func:`flush_together`): one Arrow batch instead of one per partition, whose fixed
cost (ten arrays for a few rows) was paid per topic-partition.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from inorder.engine.apply import OrderedApplier
from inorder.engine.results import ResultFile, TaskResult
from inorder.engine.task_output import GATHER_BELOW_ROWS, TaskOutput, write_dead_letters
from inorder.engine.task_spec import TaskSpec
from inorder.engine.violations import ViolationEvent
from inorder.records import TopicPartition
from inorder.sinks.base import WrittenFile
from inorder.state.entry import PartitionMeta, StateView
from inorder.state.store import PartitionStore
from inorder.state.store_commit import commit_partitions
from inorder.state.task_deltas import TaskFiles

#: Rows buffered before they are encoded and handed to the sink writer.
_FLUSH_ROWS = 65_536


def open_applier(
    spec: TaskSpec,
    tp: TopicPartition,
    store_tp: TopicPartition,
    state_codec: Any,
    external_watermark: bool = False,
    slot: str | None = None,
    listed: TaskFiles | None = None,
) -> tuple[PartitionStore, OrderedApplier]:
    """Open the state of ``store_tp`` as of the batch before ``spec.batch_id`` and an applier
    for the records of ``tp`` over it (the same store for the partition backend; a key
    group's own store for the spark backend), cached in the task slot ``slot`` if given,
    its versions found in the task files as ``listed`` (listed at its open if ``None``)."""
    store = PartitionStore(
        spec.checkpoint, store_tp, state_codec, spec.epoch, spec.state_options, slot, listed
    )
    view, meta = store.open(spec.batch_id)
    return store, new_applier(spec, tp, view, meta, state_codec, external_watermark)


def new_applier(
    spec: TaskSpec,
    tp: TopicPartition,
    view: StateView,
    meta: PartitionMeta,
    state_codec: Any,
    external_watermark: bool = False,
) -> OrderedApplier:
    """The applier of ``tp`` for ``spec``'s batch over ``view`` (state copied by its codec)."""
    return OrderedApplier(
        spec.processor,
        spec.codec,
        spec.integrity,
        view,
        tp.topic,
        tp.partition,
        spec.batch_id,
        spec.processing_us,
        meta,
        max_events=spec.max_events,
        copy_state=state_codec.copy,
        external_watermark=external_watermark,
    )


class PartitionWork:
    """One topic-partition inside a task: its store and applier; its rows go to the task's
    shared :class:`~inorder.engine.task_output.TaskOutput`."""

    def __init__(
        self,
        spec: TaskSpec,
        tp: TopicPartition,
        encoder: Any,
        state_codec: Any,
        output: TaskOutput,
        slot: str | None = None,
        listed: TaskFiles | None = None,
    ) -> None:
        self.spec = spec
        self.tp = tp
        self.encoder = encoder
        self.output = output
        started = time.perf_counter()
        self.store, self.applier = open_applier(spec, tp, tp, state_codec, slot=slot, listed=listed)
        self.output_rows = 0
        self.failed: ViolationEvent | None = None
        self.dead_letter_files: list[WrittenFile] = []
        self.timings: dict[str, float] = {"load": time.perf_counter() - started, "write": 0.0}
        #: ``[start, end]`` of the offsets its marker rows gave this partition (``None``: none).
        self.planned: list[int] | None = None

    def plan(self, start: int, end: int) -> None:
        """Note a range ``[start, end)`` a marker row gave this partition (its ranges follow
        each other: together they span the first start to the last end)."""
        if self.planned is None:
            self.planned = [start, end]
        else:
            self.planned = [min(self.planned[0], start), max(self.planned[1], end)]

    def flush(self, force: bool = False) -> None:
        """Encode buffered rows and hand them to the task's output."""
        applier = self.applier
        if applier.failed is not None or not applier.rows:
            return
        if not force and len(applier.rows) < _FLUSH_ROWS:
            return
        started = time.perf_counter()
        spec = self.spec
        batch = self.encoder.encode_with_origin(
            applier.rows, self.tp.topic, self.tp.partition, applier.row_offsets, spec.batch_id
        )
        self.output.write(batch)
        self.output_rows += batch.num_rows
        applier.rows.clear()
        applier.row_offsets.clear()
        self.timings["write"] += time.perf_counter() - started

    def drain(self) -> ViolationEvent | None:
        """Fire timers; the event that stopped the partition, if any (also kept in
        :attr:`failed`). Its last rows wait for :func:`flush_together`."""
        applier = self.applier
        started = time.perf_counter()
        applier.finish()
        self.timings["apply"] = self.timings.get("apply", 0.0) + time.perf_counter() - started
        self.failed = applier.failed
        return self.failed

    def flush_last(self) -> None:
        """Hand the last rows to the output alone; rows that do not fit the output schema
        fail the partition (a processor's bug) with the row named."""
        if self.failed is not None:
            return
        try:
            self.flush(force=True)
        except Exception as exc:
            self.fail_output(exc)

    def fail_output(
        self, exc: Exception, what: str = "output row does not fit the output schema"
    ) -> None:
        """Fail the partition: its rows could not be handed to the output (the task's output
        is then deleted and the batch fails on the driver)."""
        from inorder.engine.violations import PROCESSOR_ERROR

        self.failed = ViolationEvent(
            self.tp.topic,
            self.tp.partition,
            self.applier.meta.last_offset,
            None,
            PROCESSOR_ERROR,
            f"{what}: {exc}",
            "fail",
        )

    def stage_dead_letters(self) -> None:
        """Stage the partition's dead letters (none when it failed)."""
        applier, spec = self.applier, self.spec
        if self.failed is None and applier.dead_letters and spec.dead_letter_sink is not None:
            key = f"{self.tp.topic}-{self.tp.partition}-{self.output.key}"
            self.dead_letter_files = write_dead_letters(
                spec.dead_letter_sink, spec.batch_id, self.tp, key, applier.dead_letters
            )

    def finish(self, files: list[WrittenFile]) -> TaskResult:
        """The partition's result (its state committed by :func:`finish_task`), reporting
        ``files`` (the task's staged output files, given to one of its partitions)."""
        applier = self.applier
        dl_files = self.dead_letter_files
        if self.failed is None:
            self.timings["state"] = self.store.stats.commit_seconds
        state_keys = self.store.key_count()
        self.timings["store_load"] = self.store.stats.load_seconds
        self.timings["cache_hit"] = float(self.store.stats.cache_hit)
        self.timings["cache_reused"] = float(self.store.stats.reused_handle)
        self.timings["cache_opened"] = float(self.store.stats.opened_db)
        self.timings["caught_up"] = float(self.store.stats.caught_up)
        self.store.close()
        result = task_result(
            self.tp, applier, self.output_rows, files, dl_files, state_keys, self.timings,
            self.failed,
        )  # fmt: skip
        result.planned = self.planned
        return result


def finish_task(parts: list[PartitionWork], output: TaskOutput) -> list[TaskResult]:
    """Drain every partition, close the task's output once, then commit the state deltas of
    the partitions that did not fail, together
    (:func:`~inorder.state.store_commit.commit_partitions`).

    The files of the whole task are reported by its first partition's result (the driver
    commits the files of all results together). A failed partition fails the batch on the
    driver, so then nothing of the task's output is kept: it is deleted here at once.
    """
    for p in parts:
        p.drain()
    flush_together(parts)
    if any(p.failed is not None for p in parts):
        output.abort()
        files: list[WrittenFile] = []
    else:
        files = output.close()
        writers = [p for p in parts if p.output_rows] or parts[:1]
        for p in writers:  # the footers' and last row groups' time, shared by the writers
            p.timings["write"] += output.close_seconds / len(writers)
    committing = [p for p in parts if p.failed is None]
    for p in committing:
        p.stage_dead_letters()
    commit_partitions((p.store, p.applier.changes(), p.applier.meta) for p in committing)
    return [p.finish(files if i == 0 else []) for i, p in enumerate(parts)]


def task_result(
    tp: TopicPartition,
    applier: OrderedApplier,
    output_rows: int,
    files: list[WrittenFile],
    dead_letter_files: list[WrittenFile],
    state_keys: int,
    timings: dict[str, float],
    failed: ViolationEvent | None,
) -> TaskResult:
    """The small result a task returns to the driver."""
    return TaskResult(
        topic=tp.topic,
        partition=tp.partition,
        first_offset=applier.first_offset,
        last_offset=applier.meta.last_offset,
        records=applier.counters["records"],
        output_rows=output_rows,
        files=[ResultFile.of(f) for f in files],
        dead_letter_files=[ResultFile.of(f) for f in dead_letter_files],
        state_keys=state_keys,
        violations=list(applier.violations),
        violation_counts=dict(applier.violation_counts),
        counters={**applier.counters, "dead_letters": len(applier.dead_letters)},
        timings=dict(timings),
        failed=failed,
        worker=f"{socket.gethostname()}:{os.getpid()}",
    )


#: Rows of several partitions encoded into one batch at most: enough to gather hundreds of
#: partitions' few rows, few enough that a batch stays small beside the output's own bounds.
GATHER_ROWS = 16_384


def flush_together(parts: list[PartitionWork]) -> None:
    """Hand every partition's last rows to the task's output, in the order of ``parts``:
    runs of partitions with fewer than :data:`GATHER_BELOW_ROWS` rows are encoded as one
    batch (:meth:`RowEncoder.encode_runs`) and gathered by the output as their batches were
    one by one; a partition with more rows is encoded alone and goes to the writer at once.

    When a gathered batch does not encode (a row that does not fit the output schema), its
    partitions are encoded one by one, so the partition and row at fault are named and only
    that partition fails.
    """
    gathered: list[PartitionWork] = []
    rows = 0
    for p in parts:
        if p.failed is not None or not p.applier.rows:
            continue
        n = len(p.applier.rows)
        if n >= GATHER_BELOW_ROWS:
            _flush_gathered(gathered)
            gathered, rows = [], 0
            p.flush_last()
            continue
        gathered.append(p)
        rows += n
        if rows >= GATHER_ROWS:
            _flush_gathered(gathered)
            gathered, rows = [], 0
    _flush_gathered(gathered)


def _flush_gathered(parts: list[PartitionWork]) -> None:
    if len(parts) < 2:
        for p in parts:
            p.flush_last()
        return
    started = time.perf_counter()
    rows: list[Any] = []
    offsets: list[int] = []
    runs: list[tuple[str, int, int]] = []
    for p in parts:
        rows += p.applier.rows
        offsets += p.applier.row_offsets
        runs.append((p.tp.topic, p.tp.partition, len(p.applier.rows)))
    first = parts[0]
    try:
        batch = first.encoder.encode_runs(rows, runs, offsets, first.spec.batch_id)
    except Exception:  # named per partition below, where it belongs
        for p in parts:
            p.flush_last()
        return
    try:
        first.output.gather(batch)
    except Exception as exc:  # not retried per partition: part of it may have been written
        for p in parts:
            p.fail_output(exc, "output rows could not be staged")
        return
    share = (time.perf_counter() - started) / len(parts)
    for p in parts:
        p.output_rows += len(p.applier.rows)
        p.applier.rows.clear()
        p.applier.row_offsets.clear()
        p.timings["write"] += share
