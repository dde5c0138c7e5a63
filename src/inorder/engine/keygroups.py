"""Stage 1 of the Spark backend: route each record to its key group, in offset order.

:func:`route_task` is the body of the ``mapInArrow`` that runs on the source's partitions
(one task per topic-partition, offset order, before any shuffle). It decodes each record,
asks the processor for its key (an undecodable record is blamed on ``processor.record_key``),
assigns the key group ``crc32(key) % groups`` (stable across processes and runs, unlike
``hash()``), and attaches the partition's running maximum event time *within this batch*
(the keyed stage raises it by the group's stored base: the driver does not know it). It adds
one marker row per key group and topic-partition carrying the batch's maximum, so every
group runs every batch (processing-time timeouts, end-of-batch watermark) and all groups of
a partition keep the same watermark base.

The keyed stage is :class:`~inorder.engine.spark_groups.GroupProcessor`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from inorder.codecs.base import DecodeError
from inorder.ddl import arrow_ddl
from inorder.engine.context import EngineContext, to_micros
from inorder.engine.task_spec import TaskSpec
from inorder.kafka.markers import is_marker_json
from inorder.records import TopicPartition


def streaming_batch_id() -> int:
    """The micro-batch id Spark sets on the jobs of a streaming batch (-1 outside one)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty("streaming.sql.batchId")
    return -1 if value is None else int(value)


#: Columns of the routed rows (stage 1 output, the keyed stage's input). ``run_max`` is the
#: partition's maximum event time in this batch up to the row (the batch's maximum on markers).
ROUTED_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("ts_us", pa.int64()),
        pa.field("headers_json", pa.string()),
        pa.field("grp", pa.int32()),
        pa.field("run_max", pa.int64()),
        pa.field("marker", pa.bool_()),
        pa.field("now_us", pa.int64()),
    ]
)
ROUTED_DDL = arrow_ddl(ROUTED_SCHEMA)


def key_group(key: str | None, groups: int) -> int:
    """The key group of a state key (stable across processes and runs)."""
    if key is None:
        return 0
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % groups


@dataclass(slots=True)
class RouteSpec:
    """What stage 1 needs: the task spec and the number of key groups per partition."""

    task: TaskSpec
    groups: int


def route_task(spec: RouteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Stage 1 (per topic-partition, offset order): key group and running max event time."""
    task = spec.task
    processor = task.processor
    decode = task.codec.decode
    custom_event_time = type(processor).event_time is not _base_event_time()
    groups = spec.groups
    seen: dict[TopicPartition, int | None] = {}
    now_us: int | None = None
    batch_id = streaming_batch_id()
    for batch in batches:
        if batch.num_rows == 0:
            continue
        cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        if now_us is None and "now_us" in cols:
            now_us = cols["now_us"][0]
        ts_col = batch.column("timestamp").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        ts_us = ts_col.to_pylist()
        out_grp: list[int] = []
        out_max: list[int | None] = []
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
                max_us = seen.setdefault(tp, None)
                ctx = EngineContext(tp.topic, tp.partition, batch_id, now_us or 0)
            assert ctx is not None
            kafka_key, value = cols["key"][i], cols["value"][i]
            if is_marker_json(kafka_key, value, cols["timestampType"][i], cols["headers_json"][i]):
                keep.append(False)
                out_grp.append(0)
                out_max.append(None)
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
                    key = None  # the keyed stage re-runs it and reports the bug
            if event_us is not None and (max_us is None or event_us > max_us):
                max_us = event_us
            out_grp.append(key_group(key, groups))
            out_max.append(max_us)
        if current is not None:
            seen[current] = max_us
        routed = pa.RecordBatch.from_arrays(
            [
                batch.column("key"),
                batch.column("value"),
                batch.column("topic"),
                batch.column("partition").cast(pa.int32()),
                batch.column("offset"),
                ts_col,
                batch.column("headers_json"),
                pa.array(out_grp, pa.int32()),
                pa.array(out_max, pa.int64()),
                pa.array([False] * batch.num_rows, pa.bool_()),
                pa.array([now_us] * batch.num_rows, pa.int64()),
            ],
            schema=ROUTED_SCHEMA,
        ).filter(pa.array(keep, pa.bool_()))
        if routed.num_rows:
            yield routed
    # One marker per key group and partition: every group runs, with the batch's maximum.
    for tp, max_us in sorted(seen.items()):
        yield pa.RecordBatch.from_arrays(
            [
                pa.nulls(groups, pa.binary()),
                pa.nulls(groups, pa.binary()),
                pa.array([tp.topic] * groups, pa.string()),
                pa.array([tp.partition] * groups, pa.int32()),
                pa.array([-1] * groups, pa.int64()),
                pa.nulls(groups, pa.int64()),
                pa.nulls(groups, pa.string()),
                pa.array(range(groups), pa.int32()),
                pa.array([max_us] * groups, pa.int64()),
                pa.array([True] * groups, pa.bool_()),
                pa.array([now_us] * groups, pa.int64()),
            ],
            schema=ROUTED_SCHEMA,
        )


def _base_event_time() -> Any:
    from inorder.processor import Processor

    return Processor.event_time
