"""The executor side of the Spark backend: route records to key groups, apply each group.

Two ``mapInArrow`` stages around one shuffle (:class:`~inorder.engine.spark_backend.SparkBackend`):

1. :func:`route_task` runs once per topic-partition, in offset order (no shuffle yet). It
   decodes each record, asks the processor for its key (an undecodable record is blamed on
   ``processor.record_key``), assigns the key group ``crc32(key) % groups`` (stable across
   processes, unlike ``hash()``), and attaches the partition's watermark as of that record
   (running max of event time - lateness, seeded with the previous batch's maximum). It adds
   one marker row per key group carrying the partition's final watermark, so every group
   runs every batch (processing-time timers, end-of-batch watermark).
2. After ``repartition`` on ``(topic, partition, group)``, :func:`group_task` collects its
   rows, **checks and stably sorts them by offset** (a shuffle does not keep order: spilling
   sorts and remote fetches reorder rows), and applies each key group with the shared
   :class:`~inorder.engine.apply.OrderedApplier` in external-watermark mode over the group's
   own versioned state (the partition backend's store, one store per key group). Output is
   staged through the sink's writer; one result row per group goes to the driver.

Keys never share state, so a key group sees exactly the calls a whole partition would make
for its keys; only event-time work that a watermark rise at another key's record triggers
happens at the group's next record (or at the end of the batch) instead, with the same
per-key order (see ``docs/engine.md``).
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.codecs.base import DecodeError
from inorder.engine.apply import PROCESSOR_ERROR, ViolationEvent
from inorder.engine.context import EngineContext, delta_micros, to_micros
from inorder.engine.task import (
    RESULT_SCHEMA,
    TaskSpec,
    open_applier,
    task_result,
    write_dead_letters,
)
from inorder.records import TopicPartition
from inorder.sinks.base import BatchWriter, WrittenFile

#: Columns of the routed rows (stage 1 output, stage 2 input).
ROUTED_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("headers_json", pa.string()),
        pa.field("grp", pa.int32()),
        pa.field("wm", pa.int64()),
        pa.field("marker", pa.bool_()),
    ]
)
ROUTED_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, headers_json string, grp int, wm bigint, marker boolean"
)

#: Result rows of stage 2: the partition backend's, plus the key group and the max event time.
GROUP_RESULT_SCHEMA = RESULT_SCHEMA.append(pa.field("grp", pa.int64())).append(
    pa.field("max_event_us", pa.int64())
)
GROUP_RESULT_DDL = (
    "topic string, partition bigint, first_offset bigint, last_offset bigint, records bigint, "
    "output_rows bigint, files string, dead_letter_files string, state_keys bigint, "
    "violations string, violation_counts string, counters string, timings string, "
    "failed string, grp bigint, max_event_us bigint"
)


def key_group(key: str | None, groups: int) -> int:
    """The key group of a state key (stable across processes and runs)."""
    if key is None:
        return 0
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % groups


def group_store_partition(tp: TopicPartition, group: int) -> TopicPartition:
    """Where a key group's state lives: ``state/<topic>#<partition>/<group>/``.

    ``#`` cannot occur in a Kafka topic name, so these never collide with partition stores.
    """
    return TopicPartition(f"{tp.topic}#{tp.partition}", group)


@dataclass(slots=True)
class RouteSpec:
    """What stage 1 needs: the task spec, the group count and each partition's max event time."""

    task: TaskSpec
    groups: int
    max_event_us: dict[str, int]


def _is_marker(key: Any, value: Any, ts_type: Any, headers_json: Any) -> bool:
    return (
        key is None
        and value is None
        and ts_type == -1
        and headers_json is not None
        and "inorder.range" in headers_json
    )


def route_task(spec: RouteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stage 1 (per topic-partition, offset order): key group and watermark of each record."""
    task = spec.task
    processor = task.processor
    decode = task.codec.decode
    custom_event_time = type(processor).event_time is not _base_event_time()
    lateness = delta_micros(task.integrity.lateness)
    groups = spec.groups
    seen: dict[TopicPartition, int | None] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        ts_col = batch.column("timestamp")
        ts_us = (
            [None] * batch.num_rows
            if ts_col.null_count == batch.num_rows
            else ts_col.cast(pa.int64()).to_pylist()
        )
        out_grp: list[int] = []
        out_wm: list[int | None] = []
        keep: list[bool] = []
        ctx: EngineContext | None = None
        current: TopicPartition | None = None
        max_us: int | None = None
        for i in range(batch.num_rows):
            tp = TopicPartition(cols["topic"][i], int(cols["partition"][i]))
            if tp != current:
                if current is not None:
                    seen[current] = max_us
                current = tp
                if tp in seen:
                    max_us = seen[tp]
                else:
                    max_us = spec.max_event_us.get(str(tp))
                    seen[tp] = max_us
                ctx = EngineContext(tp.topic, tp.partition, task.batch_id, task.processing_us)
            assert ctx is not None
            kafka_key, value = cols["key"][i], cols["value"][i]
            if _is_marker(kafka_key, value, cols["timestampType"][i], cols["headers_json"][i]):
                keep.append(False)
                out_grp.append(0)
                out_wm.append(None)
                continue
            keep.append(True)
            ctx.set_record(cols["offset"][i], kafka_key, ts_us[i], None)
            key: str | None
            event_us: int | None = None
            try:
                msg = decode(value, kafka_key)
            except DecodeError:
                try:
                    key = processor.record_key(kafka_key)
                except Exception:
                    key = None
            else:
                try:
                    if custom_event_time:
                        when = processor.event_time(msg, ctx)
                        event_us = None if when is None else to_micros(when)
                    else:
                        event_us = ts_us[i]
                    key = processor.key(msg)
                except Exception:
                    key = None  # the group re-runs it and reports the bug
            if event_us is not None and (max_us is None or event_us > max_us):
                max_us = event_us
            out_grp.append(key_group(key, groups))
            out_wm.append(None if max_us is None else max_us - lateness)
        if current is not None:
            seen[current] = max_us
        mask = pa.array(keep, pa.bool_())
        n = batch.num_rows
        routed = pa.RecordBatch.from_arrays(
            [
                batch.column("key"),
                batch.column("value"),
                batch.column("topic"),
                batch.column("partition").cast(pa.int32()),
                batch.column("offset"),
                ts_col.cast(pa.timestamp("us", tz="UTC")),
                batch.column("headers_json"),
                pa.array(out_grp, pa.int32()),
                pa.array(out_wm, pa.int64()),
                pa.array([False] * n, pa.bool_()),
            ],
            schema=ROUTED_SCHEMA,
        ).filter(mask)
        if routed.num_rows:
            yield routed
    # One marker per key group and partition: every group runs, with the final watermark.
    for tp, max_us in sorted(seen.items()):
        wm = None if max_us is None else max_us - lateness
        yield pa.RecordBatch.from_arrays(
            [
                pa.nulls(groups, pa.binary()),
                pa.nulls(groups, pa.binary()),
                pa.array([tp.topic] * groups, pa.string()),
                pa.array([tp.partition] * groups, pa.int32()),
                pa.array([-1] * groups, pa.int64()),
                pa.nulls(groups, pa.timestamp("us", tz="UTC")),
                pa.nulls(groups, pa.string()),
                pa.array(range(groups), pa.int32()),
                pa.array([wm] * groups, pa.int64()),
                pa.array([True] * groups, pa.bool_()),
            ],
            schema=ROUTED_SCHEMA,
        )


def _base_event_time() -> Any:
    from inorder.processor import Processor

    return Processor.event_time


def _headers(text: str | None) -> list[tuple[str, bytes | None]] | None:
    if text is None:
        return None
    import base64

    return [
        (h.get("key"), None if h.get("value") is None else base64.b64decode(h["value"]))
        for h in json.loads(text)
    ]


class _GroupWork:
    """One key group of one topic-partition: its store, applier and writer."""

    def __init__(
        self, spec: TaskSpec, tp: TopicPartition, group: int, encoder: Any, state_codec: Any
    ) -> None:
        started = time.perf_counter()
        self.spec = spec
        self.tp = tp
        self.group = group
        self.encoder = encoder
        self.store, self.applier = open_applier(
            spec, tp, group_store_partition(tp, group), state_codec, external_watermark=True
        )
        self.timings: dict[str, float] = {"load": time.perf_counter() - started}
        self.key = f"{tp.topic}-{tp.partition}-g{group}-{uuid.uuid4().hex[:12]}"

    def run(self, table: pa.Table) -> dict[str, Any]:
        """Apply the group's rows (sorted by offset, markers first) and stage its output."""
        spec = self.spec
        applier = self.applier
        started = time.perf_counter()
        markers = table.filter(table.column("marker"))
        final_wm = markers.column("wm")[0].as_py() if markers.num_rows else None
        rows = table.filter(pc.invert(table.column("marker")))
        if rows.num_rows:
            ts_col = rows.column("timestamp")
            ts = (
                [None] * rows.num_rows
                if ts_col.null_count == rows.num_rows
                else ts_col.cast(pa.int64()).to_pylist()
            )
            applier.apply(
                zip(
                    rows.column("offset").to_pylist(),
                    rows.column("key").to_pylist(),
                    rows.column("value").to_pylist(),
                    ts,
                    [_headers(h) for h in rows.column("headers_json").to_pylist()],
                    rows.column("wm").to_pylist(),
                    strict=True,
                )
            )
        applier.finish(final_wm)
        self.timings["apply"] = time.perf_counter() - started
        failed = applier.failed
        files: list[WrittenFile] = []
        dl_files: list[WrittenFile] = []
        output_rows = 0
        if failed is None:
            writer: BatchWriter | None = None
            try:
                if applier.rows:
                    batch = self.encoder.encode_with_origin(
                        applier.rows,
                        self.tp.topic,
                        self.tp.partition,
                        applier.row_offsets,
                        spec.batch_id,
                    )
                    writer = spec.sink.open_writer(spec.output_schema, spec.batch_id, self.key)
                    writer.write(batch)
                    output_rows = batch.num_rows
                    files = writer.close()
            except Exception as exc:  # an output row that does not fit the schema is a bug
                if writer is not None:
                    writer.abort()
                failed = ViolationEvent(
                    self.tp.topic,
                    self.tp.partition,
                    applier.meta.last_offset,
                    None,
                    PROCESSOR_ERROR,
                    f"output row does not fit the output schema: {exc}",
                    "fail",
                )
        if failed is None:
            if applier.dead_letters and spec.dead_letter_sink is not None:
                dl_files = write_dead_letters(spec, self.tp, self.key, applier.dead_letters)
            started = time.perf_counter()
            self.store.commit(applier.changes(), applier.meta)
            self.timings["state"] = time.perf_counter() - started
        state_keys = self.store.key_count()
        self.store.close()
        return {
            **task_result(
                self.tp, applier, output_rows, files, dl_files, state_keys, self.timings, failed
            ),
            "grp": self.group,
            "max_event_us": applier.meta.max_event_us,
        }


def group_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stage 2: check and stably sort this task's rows, apply each key group, yield results."""
    from inorder.schema import RowEncoder
    from inorder.statecodec import StateCodec

    parts = [b for b in batches if b.num_rows]
    if not parts:
        return
    table = pa.Table.from_batches(parts)
    order = ["topic", "partition", "grp", "offset"]
    # A shuffle does not keep the order rows had in Kafka: sort (stable) unless already sorted.
    if not _is_sorted(table, order):
        table = table.take(pc.sort_indices(table, sort_keys=[(c, "ascending") for c in order]))
    encoder = RowEncoder(spec.out_type)
    state_codec = StateCodec(spec.state_type)
    topics = table.column("topic").to_pylist()
    partitions = table.column("partition").to_pylist()
    groups = table.column("grp").to_pylist()
    results: list[dict[str, Any]] = []
    start = 0
    n = table.num_rows
    for i in range(1, n + 1):
        if i == n or (topics[i], partitions[i], groups[i]) != (
            topics[start],
            partitions[start],
            groups[start],
        ):
            tp = TopicPartition(topics[start], int(partitions[start]))
            work = _GroupWork(spec, tp, int(groups[start]), encoder, state_codec)
            results.append(work.run(table.slice(start, i - start)))
            start = i
    yield pa.RecordBatch.from_pylist(results, schema=GROUP_RESULT_SCHEMA)


def _is_sorted(table: pa.Table, order: list[str]) -> bool:
    cols = [table.column(c).to_pylist() for c in order]
    rows = list(zip(*cols, strict=True))
    return all(rows[i] <= rows[i + 1] for i in range(len(rows) - 1))
