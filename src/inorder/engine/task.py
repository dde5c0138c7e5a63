"""The executor side of the partition backend: one Spark task applies its topic-partition(s).

:func:`run_task` is the body of ``mapInArrow``: it reads the task's Arrow batches (Kafka
schema, offset order, a marker row first when the source adds them), applies them with
:class:`~inorder.engine.apply.OrderedApplier` over the partition's versioned state, stages
output (and dead-letter) files through the sinks' writers, writes the state delta of the
batch, and yields one small result row per topic-partition. Data problems never raise here:
they are reported in the result row and the driver decides.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.engine.beacon import ProgressBeacon
from inorder.engine.results import RESULT_SCHEMA, result_row
from inorder.engine.task_output import TaskOutput
from inorder.engine.task_partition import PartitionWork, finish_task
from inorder.engine.task_spec import TaskSpec
from inorder.kafka.consumer import read_ranges_records
from inorder.kafka.markers import marker_rows
from inorder.kafka.options import SourceOptions
from inorder.records import RecordTuple, TopicPartition
from inorder.spark.worker_heap import freeze_worker_heap
from inorder.state.store import close_task_slot
from inorder.state.task_deltas import TaskFiles

__all__ = ["INPUT_EXPRS", "TaskSpec", "read_waves", "run_task"]

#: A task whose first input batch names at least this many topic-partitions (a range group)
#: caches their state in a task slot of its own (:mod:`inorder.state.registry`): one database
#: open when the group moves to another process, instead of catching each partition up.
TASK_SLOT_MIN_PARTITIONS = 8


#: The projection the driver applies before ``mapInArrow``. Spark converts an
#: ``array<struct>`` column to Arrow slowly even when it is empty (measured: 2M records/6 s on
#: two cores, most of a batch's time), so headers travel as JSON, and only when present.
INPUT_EXPRS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "CASE WHEN size(headers) > 0 THEN to_json(headers) END AS headers_json",
)


def _headers_of_json(text: str | None) -> list[tuple[str, bytes | None]] | None:
    """Headers from the JSON form (``to_json`` writes binary values as base64)."""
    if text is None:
        return None
    return [
        (h.get("key"), None if h.get("value") is None else base64.b64decode(h["value"]))
        for h in json.loads(text)
    ]


def _headers_column(batch: pa.RecordBatch) -> list[Any]:
    """Per-row headers (``None`` when a row has none)."""
    n = batch.num_rows
    names = batch.schema.names
    if "headers_json" in names:
        col = batch.column("headers_json")
        if col.null_count == n:
            return [None] * n
        return [_headers_of_json(t) for t in col.to_pylist()]
    col = batch.column("headers")
    if col.null_count == n or pc.sum(pc.list_value_length(col)).as_py() in (0, None):
        return [None] * n
    return [None if h is None else [(x["key"], x["value"]) for x in h] for h in col.to_pylist()]


def _markers(batch: pa.RecordBatch) -> list[tuple[int, int, int]]:
    """``(row index, start, end)`` of each marker row (format: :mod:`inorder.kafka.markers`);
    headers in either form the task gets them (``headers_json`` or ``headers``)."""
    return marker_rows(batch, _headers_column)


def _read_and_apply(
    work: dict[TopicPartition, PartitionWork],
    options: SourceOptions,
    ranges: list[tuple[TopicPartition, int, int]],
    beacon: ProgressBeacon,
) -> None:
    """Read every range from Kafka with one consumer and apply each chunk to its partition.

    Chunks of different partitions interleave; each partition's come in offset order, and a
    partition's applier sees only its own (state is per partition, so nothing else orders).
    A partition with several ranges has them read one after another, in the order given.
    """
    for wave in read_waves(ranges):
        _read_wave(work, options, wave, beacon)


def read_waves(
    ranges: list[tuple[TopicPartition, int, int]],
) -> list[list[tuple[TopicPartition, int, int]]]:
    """``ranges`` in waves of distinct partitions: wave k holds each partition's k-th range."""
    waves: list[list[tuple[TopicPartition, int, int]]] = []
    seen: dict[TopicPartition, int] = {}
    for tp, start, end in ranges:
        k = seen[tp] = seen.get(tp, -1) + 1
        if k == len(waves):
            waves.append([])
        waves[k].append((tp, start, end))
    return waves


def _read_wave(
    work: dict[TopicPartition, PartitionWork],
    options: SourceOptions,
    ranges: list[tuple[TopicPartition, int, int]],
    beacon: ProgressBeacon,
) -> None:
    """Read ranges of distinct partitions with one consumer; apply each chunk.

    Offsets the read skipped as lost (``failOnDataLoss=false``) are counted per partition
    (``skipped_lost``): the run's summary and exit code say what the policy set aside.
    """
    lost: dict[TopicPartition, int] = {}
    chunks = read_ranges_records(options, ranges, lost)
    failed: set[TopicPartition] = set()
    try:
        while len(failed) < len(ranges):
            asked = time.perf_counter()
            item = next(chunks, None)
            started = time.perf_counter()
            if item is None:
                return
            tp, chunk = item
            part = work[tp]
            part.timings["read"] = part.timings.get("read", 0.0) + started - asked
            if part.applier.failed is not None:  # stopped by its policy: the rest is not applied
                failed.add(tp)
                continue
            part.applier.apply(chunk)
            part.timings["apply"] = part.timings.get("apply", 0.0) + time.perf_counter() - started
            part.flush()
            beacon.add(tp, len(chunk))
    finally:
        chunks.close()
        for tp, n in lost.items():
            counters = work[tp].applier.counters
            counters["skipped_lost"] = counters.get("skipped_lost", 0) + n


def task_slot() -> str | None:
    """The task slot of the running Spark task, ``group@<partition>`` (``None`` outside Spark).

    The source deals a range group the same partitions batch after batch
    (:func:`inorder.kafka.input_partitions.group_ranges`), as the same Spark partition, so
    the partition index names the group's cache whichever process runs it.
    """
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    context = TaskContext.get()
    return None if context is None else f"group@{context.partitionId()}"


def _record_tuples(batch: pa.RecordBatch) -> Iterator[RecordTuple]:
    """The applier's record tuples of an Arrow batch (column-wise conversion: fast)."""
    n = batch.num_rows
    offsets = batch.column("offset").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    ts_col = batch.column("timestamp")
    ts = [None] * n if ts_col.null_count == n else ts_col.cast(pa.int64()).to_pylist()
    return zip(offsets, keys, values, ts, _headers_column(batch), strict=True)


def _runs(batch: pa.RecordBatch) -> Iterator[tuple[TopicPartition, pa.RecordBatch]]:
    """Split a batch into runs of one topic-partition each (normally the whole batch)."""
    topics = batch.column("topic")
    parts = batch.column("partition")
    if len(pc.unique(topics)) == 1 and len(pc.unique(parts)) == 1:
        yield TopicPartition(topics[0].as_py(), int(parts[0].as_py())), batch
        return
    t_list = topics.to_pylist()
    p_list = parts.to_pylist()
    start = 0
    for i in range(1, batch.num_rows + 1):
        if i == batch.num_rows or t_list[i] != t_list[start] or p_list[i] != p_list[start]:
            yield TopicPartition(t_list[start], int(p_list[start])), batch.slice(start, i - start)
            start = i


def run_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow body: apply every topic-partition of this task; yield result rows."""
    from inorder.schema import RowEncoder
    from inorder.state.codec import StateCodec

    encoder = RowEncoder(spec.out_type)
    state_codec = StateCodec(spec.state_type)
    output = TaskOutput(spec.sink, spec.output_schema, spec.batch_id)
    work: dict[TopicPartition, PartitionWork] = {}
    beacon = ProgressBeacon(spec.progress_to, spec.batch_id)
    reads = spec.source_options  # set: the task reads the planned ranges from Kafka itself
    to_read: list[tuple[TopicPartition, int, int]] = []
    slot: str | None = None
    # The task files (state format 3) listed once for all of the task's partitions.
    listed: TaskFiles | None = None
    # Time spent waiting for input (the source's read and Spark moving the rows), charged to
    # the topic-partition of the batch that arrived: it shows where a batch's time goes.
    waited = 0.0
    asked = time.perf_counter()
    for batch in batches:
        waited += time.perf_counter() - asked
        if batch.num_rows == 0:
            asked = time.perf_counter()
            continue
        runs = list(_runs(batch))
        if not work and len(runs) >= TASK_SLOT_MIN_PARTITIONS:
            slot = task_slot()
        for tp, run in runs:
            part = work.get(tp)
            if part is None:
                if listed is None:
                    listed = spec.checkpoint.task_files()
                part = PartitionWork(spec, tp, encoder, state_codec, output, slot, listed)
                work[tp] = part
            if waited:
                part.timings["input_wait"] = part.timings.get("input_wait", 0.0) + waited
                waited = 0.0
            found = _markers(run)
            markers = [i for i, _, _ in found]
            for _, start, end in found:
                part.plan(start, end)
            if reads is not None:
                to_read.extend((tp, start, end) for _, start, end in found)
            if markers == [0]:
                run = run.slice(1)
            elif markers:
                dropped = set(markers)
                keep = [i not in dropped for i in range(run.num_rows)]
                run = run.filter(pa.array(keep, pa.bool_()))
            if run.num_rows == 0:
                continue
            if reads is not None and to_read:  # records after planned ranges: those go first
                _read_and_apply(work, reads, to_read, beacon)
                to_read = []
            started = time.perf_counter()
            part.applier.apply(_record_tuples(run))
            part.timings["apply"] = part.timings.get("apply", 0.0) + time.perf_counter() - started
            part.flush()
            beacon.add(tp, run.num_rows)
        asked = time.perf_counter()
    if reads is not None and to_read:
        # Ranges are read once every marker has arrived: one consumer for all of them.
        _read_and_apply(work, reads, to_read, beacon)
    beacon.close()
    # One sync for every state file of the task instead of two fsyncs per topic-partition.
    with spec.checkpoint.durable_together():
        results = finish_task([work[tp] for tp in sorted(work)], output)
    del work
    if slot is not None:
        close_task_slot(spec.checkpoint.root, spec.state_options, slot)
    freeze_worker_heap()
    if results:
        yield pa.RecordBatch.from_pylist([result_row(r) for r in results], schema=RESULT_SCHEMA)
