"""The reference runner: the engine's semantics in plain Python, no Spark, no storage.

It drives the same :class:`~inorder.engine.apply.OrderedApplier` as the partition backend's
Spark tasks, over in-memory state, micro-batch by micro-batch. Tests use it as the oracle
(the partition backend must produce exactly its rows and state); replay and validation tools
build on it.

Like the partition backend with the source's partition markers, every topic-partition seen
so far takes part in every later batch, even without new records (so processing-time
timeouts fire in idle batches).
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from inorder.codecs.base import Codec
from inorder.engine.apply import OrderedApplier
from inorder.engine.context import to_micros
from inorder.engine.violations import PROCESSOR_ERROR, DeadLetter, ViolationEvent
from inorder.errors import InorderError, IntegrityError
from inorder.integrity import Integrity
from inorder.processor import Processor, processor_types
from inorder.records import KafkaRecord, RecordTuple, TopicPartition
from inorder.state.entry import KeyEntry, PartitionMeta


class DictStateView:
    """A :class:`~inorder.state.entry.StateView` over a plain dict of committed entries."""

    def __init__(self, entries: dict[str, KeyEntry]) -> None:
        self._entries = entries
        self._timers: dict[int, list[tuple[int, str]]] = {}

    def load(self, key: str) -> KeyEntry | None:
        """A copy of the committed entry of ``key`` (a failed batch must not change it)."""
        entry = self._entries.get(key)
        return None if entry is None else copy.deepcopy(entry)

    def timers_after(
        self, kind: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str]]:
        """Committed timers of ``kind`` after ``after``, in (deadline, key) order."""
        timers = self._timers.get(kind)
        if timers is None:
            timers = sorted(
                (e.timer, k)
                for k, e in self._entries.items()
                if e.timer is not None and e.timer_kind == kind
            )
            self._timers[kind] = timers
        start = 0 if after is None else bisect.bisect_right(timers, after)
        return timers[start : start + limit]


def record_tuple(record: KafkaRecord) -> RecordTuple:
    """A :class:`KafkaRecord` as the applier's record tuple."""
    ts = None if record.timestamp is None else to_micros(record.timestamp)
    return (record.offset, record.key, record.value, ts, record.headers)


@dataclass(slots=True)
class ReferenceBatch:
    """What one batch produced."""

    batch_id: int
    rows: list[dict[str, Any]]
    violations: list[ViolationEvent]
    dead_letters: list[tuple[TopicPartition, DeadLetter]]
    violation_counts: dict[str, int]
    counters: dict[str, int]


@dataclass(slots=True)
class ReferenceResult:
    """Everything a run produced, in order."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    violations: list[ViolationEvent] = field(default_factory=list)
    dead_letters: list[tuple[TopicPartition, DeadLetter]] = field(default_factory=list)
    batches: list[ReferenceBatch] = field(default_factory=list)


class ReferenceRunner:
    """Applies records to a processor with the partition backend's exact semantics."""

    def __init__(
        self,
        processor: Processor[Any, Any, Any],
        codec: Codec[Any],
        integrity: Integrity,
        *,
        out_type: Any = None,
    ) -> None:
        self.processor = processor
        self.codec = codec
        self.integrity = integrity
        self.out_type = out_type if out_type is not None else processor_types(processor).out
        self._encoder: Any = None
        self.state: dict[TopicPartition, dict[str, KeyEntry]] = {}
        self.meta: dict[TopicPartition, PartitionMeta] = {}
        self.result = ReferenceResult()

    def _rows_as_dicts(
        self, rows: list[Any], tp: TopicPartition, offsets: list[int], batch_id: int
    ) -> list[dict[str, Any]]:
        if not rows:
            return []
        if self._encoder is None:
            from inorder.schema import RowEncoder

            self._encoder = RowEncoder(self.out_type)
        batch = self._encoder.encode_with_origin(rows, tp.topic, tp.partition, offsets, batch_id)
        out: list[dict[str, Any]] = batch.to_pylist()
        return out

    def run_batch(
        self,
        records: Iterable[KafkaRecord],
        batch_id: int,
        processing_time: datetime,
        partitions: Iterable[TopicPartition] = (),
    ) -> ReferenceBatch:
        """Apply one micro-batch; raise :class:`IntegrityError` on a ``fail`` violation.

        On failure nothing of the batch is kept (as the partition backend does not commit).
        """
        by_tp: dict[TopicPartition, list[RecordTuple]] = {tp: [] for tp in self.state}
        for tp in partitions:
            by_tp.setdefault(tp, [])
        for record in records:
            by_tp.setdefault(TopicPartition(record.topic, record.partition), []).append(
                record_tuple(record)
            )
        appliers: list[tuple[TopicPartition, OrderedApplier, dict[str, KeyEntry]]] = []
        for tp in sorted(by_tp):
            committed = self.state.get(tp, {})
            meta = self.meta.get(tp, PartitionMeta())
            work_meta = PartitionMeta(meta.last_offset, meta.max_event_us)
            applier = OrderedApplier(
                self.processor,
                self.codec,
                self.integrity,
                DictStateView(committed),
                tp.topic,
                tp.partition,
                batch_id,
                processing_time,
                work_meta,
            )
            applier.apply(by_tp[tp])
            applier.finish()
            appliers.append((tp, applier, committed))
        failures = [a.failed for _, a, _ in appliers if a.failed is not None]
        if failures:
            raise_failure(failures)
        batch = ReferenceBatch(batch_id, [], [], [], {}, {})
        for tp, applier, committed in appliers:
            for key, entry in applier.changes().items():
                if entry is None:
                    committed.pop(key, None)
                else:
                    committed[key] = entry
            self.state[tp] = committed
            self.meta[tp] = applier.meta
            batch.rows.extend(self._rows_as_dicts(applier.rows, tp, applier.row_offsets, batch_id))
            batch.violations.extend(applier.violations)
            batch.dead_letters.extend((tp, d) for d in applier.dead_letters)
            for rule, n in applier.violation_counts.items():
                batch.violation_counts[rule] = batch.violation_counts.get(rule, 0) + n
            for name, n in applier.counters.items():
                batch.counters[name] = batch.counters.get(name, 0) + n
        self.result.rows.extend(batch.rows)
        self.result.violations.extend(batch.violations)
        self.result.dead_letters.extend(batch.dead_letters)
        self.result.batches.append(batch)
        return batch

    def run(
        self,
        batches: Sequence[Sequence[KafkaRecord]],
        processing_times: Sequence[datetime] | None = None,
        first_batch_id: int = 0,
    ) -> ReferenceResult:
        """Apply several micro-batches (default processing time: the epoch + batch id s)."""
        for i, records in enumerate(batches):
            when = (
                processing_times[i]
                if processing_times is not None
                else datetime.fromtimestamp(first_batch_id + i, tz=UTC)
            )
            self.run_batch(records, first_batch_id + i, when)
        return self.result

    def final_state(self) -> dict[tuple[str, int, str], Any]:
        """``(topic, partition, key) -> state`` of every key holding state."""
        return {
            (tp.topic, tp.partition, key): entry.state
            for tp, entries in self.state.items()
            for key, entry in entries.items()
            if not entry.ignored
        }


def raise_failure(failures: Sequence[ViolationEvent]) -> None:
    """Raise the error for the first failure, by (topic, partition, offset)."""
    first = min(failures, key=lambda e: (e.topic, e.partition, e.offset))
    if first.rule == PROCESSOR_ERROR:
        raise InorderError(
            f"processor failed at {first.topic}[{first.partition}] offset "
            f"{first.offset} (key {first.key!r}): {first.detail}"
        )
    raise IntegrityError(f"integrity violation: {first.message()}")
