"""The keyed stage of the Spark backend: one key group per ``transformWithStateInPandas`` call.

The query groups routed rows by ``(topic, partition, grp)``
(:func:`~inorder.engine.keygroups.route_task`) and runs :class:`GroupProcessor` on each
group, every micro-batch (each group gets a marker row every batch). A call:

1. **checks and stably sorts** the group's rows by offset (Spark promises no order inside a
   group: spilling sorts and remote shuffle fetches reorder rows);
2. computes each record's partition watermark: the group's stored base (the partition's
   maximum event time before this batch, kept identical in every group of a partition because
   they all see the same markers) raised by the batch's running maximum the route stage
   attached to the record;
3. applies the records with the shared :class:`~inorder.engine.apply.OrderedApplier`
   (external-watermark mode) over :class:`MapStateView`, a view of the group's Spark state;
4. stages output and dead letters through the sinks' writers (the micro-batch id comes from
   the ``streaming.sql.batchId`` local property Spark sets on the batch's jobs), writes the
   changed keys back to Spark's state and yields ONE small result row for the driver.

State per group (Spark's RocksDB store, Avro encoding): MapState ``entries`` (state key ->
the :class:`~inorder.state.entry.KeyEntry` fields, the processor state as bytes of inorder's
state codec) and ValueState ``meta`` (last consumed offset, maximum event time, and lower
bounds of the earliest pending event- and processing-time timers). Only the keys a batch
touches are read, except when a bound says a stored timer may be due: then the group's map
is scanned once to build its timer index.

Nothing raises out of :meth:`GroupProcessor.handleInputRows`: violations under ``fail`` and
processor errors travel in the result row and the driver raises the one-line error.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib
import time
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from inorder.ddl import arrow_ddl
from inorder.engine.apply import OrderedApplier
from inorder.engine.context import EVENT_TIME, PROCESSING_TIME, delta_micros
from inorder.engine.keygroups import streaming_batch_id
from inorder.engine.results import RESULT_SCHEMA, TaskResult, failure_result, result_row
from inorder.engine.task import _headers_of_json
from inorder.engine.task_output import write_dead_letters
from inorder.engine.task_partition import new_applier, task_result
from inorder.engine.task_spec import TaskSpec
from inorder.engine.violations import PROCESSOR_ERROR, ViolationEvent
from inorder.records import TopicPartition
from inorder.sinks.base import BatchWriter, WrittenFile
from inorder.state.cache import entry_row
from inorder.state.entry import KeyEntry, PartitionMeta

#: Schema of the ``entries`` MapState: user key, then the KeyEntry fields.
ENTRY_KEY_DDL = "k string"
ENTRY_VALUE_DDL = (
    "state binary, last_offset long, last_ts long, kafka_key binary, seq long, "
    "timer long, timer_kind int, ignored boolean"
)
#: Schema of the ``meta`` ValueState.
META_DDL = "last_offset long, max_event_us long, et_min long, pt_min long, keys long"

#: Result rows (one per group and batch): a task result, the group, the batch's time.
GROUP_RESULT_SCHEMA = pa.schema(
    [
        *RESULT_SCHEMA,
        pa.field("grp", pa.int64()),
        pa.field("batch_id", pa.int64()),
        pa.field("processing_us", pa.int64()),
    ]
)
GROUP_RESULT_DDL = arrow_ddl(GROUP_RESULT_SCHEMA)

_Raw = tuple[Any, ...]

#: Read the whole group's map up front when the batch has at least 1/_SCAN_RATIO as many
#: records as the group has keys: the map iterator fetches rows in batches, while each
#: ``getValue`` is a round trip to Spark's state server (~10k/s measured).
_SCAN_RATIO = 8


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a < b else b


class MapStateView:
    """The applier's :class:`~inorder.state.entry.StateView` over a group's MapState.

    ``load`` reads one key (one state-server round trip). ``timers_after`` answers from a
    timer index built by scanning the map once, and only when a stored timer can be due in
    this batch (its kind's stored lower bound is at or below ``reach``: the batch's final
    watermark, or its processing time); otherwise no stored timer can fire and it answers
    with none.
    """

    def __init__(
        self,
        entries: Any,
        decode: Any,
        bounds: dict[int, int | None],
        reach: dict[int, int | None],
    ) -> None:
        self._entries = entries
        self._decode = decode
        self._bounds = bounds
        self._reach = reach
        self.scanned: dict[str, _Raw] | None = None
        self.found: dict[str, bool] = {}
        self._timers: dict[int, list[tuple[int, str]]] = {}

    def _entry(self, raw: _Raw | None) -> KeyEntry | None:
        if raw is None:
            return None
        state_bytes, last_offset, last_ts, kafka_key, seq, timer, timer_kind, ignored = raw
        state = None if state_bytes is None else self._decode(state_bytes)
        return KeyEntry(
            state, last_offset, last_ts, kafka_key, seq, timer, timer_kind or 0, bool(ignored)
        )

    def load(self, key: str) -> KeyEntry | None:
        """The stored entry of ``key`` (as of the previous batch)."""
        raw = self.scanned.get(key) if self.scanned is not None else self._entries.getValue((key,))
        self.found[key] = raw is not None
        return self._entry(raw)

    def existed(self, key: str) -> bool:
        """Whether ``key`` had a stored entry before this batch."""
        if self.scanned is not None:
            return key in self.scanned
        known = self.found.get(key)
        if known is None:
            known = self.found[key] = bool(self._entries.containsKey((key,)))
        return known

    def scan(self) -> dict[str, _Raw]:
        """Every stored entry of the group (read once), indexing pending timers."""
        if self.scanned is None:
            scanned: dict[str, _Raw] = {}
            timers: dict[int, list[tuple[int, str]]] = {EVENT_TIME: [], PROCESSING_TIME: []}
            for user_key, value in self._entries.iterator():
                key = user_key[0]
                scanned[key] = tuple(value)
                if value[5] is not None:
                    timers.setdefault(value[6] or 0, []).append((value[5], key))
            for items in timers.values():
                items.sort()
            self.scanned = scanned
            self._timers = timers
        return self.scanned

    def timers_after(
        self, kind: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str]]:
        """Stored timers of ``kind`` after ``after``, in order (none when none can be due)."""
        bound, reach = self._bounds.get(kind), self._reach.get(kind)
        if self.scanned is None and (bound is None or reach is None or bound > reach):
            return []
        self.scan()
        items = self._timers.get(kind, [])
        start = 0 if after is None else bisect.bisect_right(items, after)
        return items[start : start + limit]

    def new_bounds(self, changes: dict[str, KeyEntry | None]) -> dict[int, int | None]:
        """Lower bounds of the earliest pending timer of each kind after this batch.

        Exact after a scan; otherwise the old bound lowered by the changed keys' timers (a
        stale bound only costs one scan later).
        """
        out: dict[int, int | None] = {}
        for kind in (EVENT_TIME, PROCESSING_TIME):
            best: int | None = None
            if self.scanned is None:
                best = self._bounds.get(kind)
            else:
                for deadline, key in self._timers.get(kind, []):
                    if key not in changes:
                        best = deadline
                        break
            for entry in changes.values():
                if entry is not None and entry.timer is not None and entry.timer_kind == kind:
                    best = _min(best, entry.timer)
            out[kind] = best
        return out


class Routed(NamedTuple):
    """One routed row as the keyed stage reads it."""

    offset: int
    key: bytes | None
    value: bytes | None
    ts_us: int | None
    headers_json: str | None
    run_max: int | None
    marker: bool
    now_us: int


def _ints(values: list[Any]) -> list[int | None]:
    # pandas holds a nullable integer column as float64 with NaN (exact below 2**53 us)
    return [None if v is None or v != v else int(v) for v in values]


def _objects(values: list[Any]) -> list[Any]:
    return [None if v is None or (isinstance(v, float) and v != v) else v for v in values]


def routed_rows(frame: Any) -> list[Routed]:
    """The rows of a pandas frame of routed rows (``transformWithStateInPandas`` input)."""
    if len(frame) == 0:
        return []
    return [
        Routed(*r)
        for r in zip(
            _ints(frame["offset"].tolist()),
            _objects(frame["key"].tolist()),
            _objects(frame["value"].tolist()),
            _ints(frame["ts_us"].tolist()),
            _objects(frame["headers_json"].tolist()),
            _ints(frame["run_max"].tolist()),
            [bool(m) for m in frame["marker"].tolist()],
            _ints(frame["now_us"].tolist()),
            strict=True,
        )
    ]


def _entry_value(entry: KeyEntry, encode: Any) -> _Raw:
    return entry_row(entry, None if entry.state is None else encode(entry.state))


def _sorted_by_offset(rows: list[Any]) -> list[Any]:
    """The rows in offset order: checked first, stably sorted only when out of order."""
    for i in range(1, len(rows)):
        if rows[i].offset < rows[i - 1].offset:
            return sorted(rows, key=lambda r: r.offset)
    return rows


class GroupProcessor(StatefulProcessor):
    """``transformWithStateInPandas`` processor: applies one key group of one partition."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the group's state variables; build the codecs once per task."""
        from inorder.schema import RowEncoder
        from inorder.state.codec import StateCodec

        self._entries = handle.getMapState("entries", ENTRY_KEY_DDL, ENTRY_VALUE_DDL)
        self._meta = handle.getValueState("meta", META_DDL)
        self._encoder = RowEncoder(self.spec.out_type)
        self._codec = StateCodec(self.spec.state_type)
        self._lateness = delta_micros(self.spec.integrity.lateness)

    def close(self) -> None:
        """Nothing to release."""

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        """Apply the group's rows of this micro-batch (pandas frames); yield its result row."""
        pd: Any = importlib.import_module("pandas")  # no type stubs installed
        topic, partition, group = str(key[0]), int(key[1]), int(key[2])
        tp = TopicPartition(topic, partition)
        batch_id = streaming_batch_id()
        batch = [rec for frame in rows for rec in routed_rows(frame)]
        processing_us = max((r.now_us for r in batch), default=0)
        try:
            result = self._run(tp, group, batch, batch_id, processing_us)
        except Exception as exc:  # a bug must reach the driver as one line, not a trace
            result = failure_result(topic, partition, f"{type(exc).__name__}: {exc}")
        row = result_row(result)
        row.update(grp=group, batch_id=batch_id, processing_us=processing_us)
        yield pd.DataFrame({k: pd.Series([v], dtype=object) for k, v in row.items()})

    def _run(
        self, tp: TopicPartition, group: int, rows: list[Any], batch_id: int, processing_us: int
    ) -> TaskResult:
        started = time.perf_counter()
        spec = dataclasses.replace(self.spec, batch_id=batch_id, processing_us=processing_us)
        lateness = self._lateness
        batch_max: int | None = None
        records: list[Any] = []
        for r in rows:
            if r.marker:
                batch_max = _max(batch_max, r.run_max)
            else:
                records.append(r)
        ordered = _sorted_by_offset(records)
        resorted = ordered is not records
        records = ordered
        stored = self._meta.get() if self._meta.exists() else None
        meta = PartitionMeta()
        bounds: dict[int, int | None] = {EVENT_TIME: None, PROCESSING_TIME: None}
        self._keys = 0
        if stored is not None:
            meta = PartitionMeta(int(stored[0]), stored[1])
            bounds = {EVENT_TIME: stored[2], PROCESSING_TIME: stored[3]}
            self._keys = int(stored[4] or 0)
        base = meta.max_event_us
        top = _max(base, batch_max)
        final_wm = None if top is None else top - lateness
        view = MapStateView(
            self._entries,
            self._codec.decode,
            bounds,
            {EVENT_TIME: final_wm, PROCESSING_TIME: processing_us},
        )
        if len(records) * _SCAN_RATIO >= self._keys > 0:
            view.scan()  # most keys are touched anyway: one batched read beats a get per key
        applier = new_applier(spec, tp, view, meta, self._codec, external_watermark=True)
        # "resorted": Spark delivered this group's rows out of offset order (spills, fetches).
        timings: dict[str, float] = {
            "load": time.perf_counter() - started,
            "resorted": float(resorted),
        }
        started = time.perf_counter()
        if records:
            applier.apply(  # records carry their watermark (external-watermark mode)
                (
                    r.offset,
                    r.key,
                    r.value,
                    r.ts_us,
                    None if r.headers_json is None else _headers_of_json(r.headers_json),
                    _watermark(base, r.run_max, lateness),
                )
                for r in records
            )
        applier.finish(final_wm)
        timings["apply"] = time.perf_counter() - started
        failed = applier.failed
        files: list[WrittenFile] = []
        dl_files: list[WrittenFile] = []
        output_rows = 0
        task_key = f"{tp.topic}-{tp.partition}-g{group}-{uuid.uuid4().hex[:12]}"
        if failed is None:
            writer: BatchWriter | None = None
            try:
                if applier.rows:
                    batch = self._encoder.encode_with_origin(
                        applier.rows, tp.topic, tp.partition, applier.row_offsets, batch_id
                    )
                    writer = spec.sink.open_writer(spec.output_schema, batch_id, task_key)
                    writer.write(batch)
                    output_rows = batch.num_rows
                    files = writer.close()
            except Exception as exc:  # an output row that does not fit the schema is a bug
                if writer is not None:
                    writer.abort()
                failed = ViolationEvent(
                    tp.topic,
                    tp.partition,
                    applier.meta.last_offset,
                    None,
                    PROCESSOR_ERROR,
                    f"output row does not fit the output schema: {exc}",
                    "fail",
                )
        if failed is None:
            if applier.dead_letters and spec.dead_letter_sink is not None:
                dl_files = write_dead_letters(
                    spec.dead_letter_sink, batch_id, tp, task_key, applier.dead_letters
                )
            started = time.perf_counter()
            self._write_back(applier, view)
            timings["state"] = time.perf_counter() - started
        return task_result(tp, applier, output_rows, files, dl_files, self._keys, timings, failed)

    def _write_back(self, applier: OrderedApplier, view: MapStateView) -> None:
        """The batch's changed keys and the group's meta into Spark's state."""
        changes = applier.changes()
        encode = self._codec.encode
        entries = self._entries
        keys = self._keys
        for k in sorted(changes):
            entry = changes[k]
            existed = view.existed(k)
            if entry is None:
                if existed:
                    entries.removeKey((k,))
                    keys -= 1
            else:
                entries.updateValue((k,), _entry_value(entry, encode))
                keys += 0 if existed else 1
        self._keys = keys
        bounds = view.new_bounds(changes)
        meta = applier.meta
        self._meta.update(
            (
                meta.last_offset,
                meta.max_event_us,
                bounds[EVENT_TIME],
                bounds[PROCESSING_TIME],
                keys,
            )
        )


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a > b else b


def _watermark(base: int | None, run_max: int | None, lateness: int) -> int | None:
    top = _max(base, run_max)
    return None if top is None else top - lateness
