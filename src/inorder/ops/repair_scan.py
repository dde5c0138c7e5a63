"""Scanning one topic-partition for ``inorder repair``: where each session lived.

The partition is applied from its start with the pipeline's own processor (the engine's apply
core, plain Python, chunk by chunk) while a :class:`~inorder.ops.sessionspans.SpanTracker`
records each key's lifetime; the scan stops at the failure point or at the first record the
processor stops at under the ``fail`` policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from inorder.codecs.base import DecodeError
from inorder.engine.apply import OrderedApplier
from inorder.engine.violations import ViolationEvent
from inorder.ops.batchlog import BatchLog, Segment
from inorder.ops.kafka_reads import read_chunks
from inorder.ops.recompute import plan_segments
from inorder.ops.sessionspans import SpanTracker
from inorder.ops.target import OpsTarget
from inorder.records import RecordTuple, TopicPartition
from inorder.state.entry import KeyEntry, PartitionMeta


@dataclass
class _Scan:
    tracker: SpanTracker
    records: int
    failed: ViolationEvent | None


def _identify(target: OpsTarget, record: RecordTuple) -> tuple[str | None, bool]:
    """The state key of a record and whether it starts a session (as the engine sees it)."""
    processor = target.processor
    try:
        msg = target.codec.decode(record[2], record[1])
    except DecodeError:
        try:
            return processor.record_key(record[1]), False
        except Exception:
            return None, False
    try:
        return processor.key(msg), bool(processor.starts_session(msg))
    except Exception:
        return None, False  # the applier reports the processor's bug and stops


def scan_partition(
    target: OpsTarget,
    tp: TopicPartition,
    start: int,
    bound: int,
    log: BatchLog | None,
    watch: str | None = None,
) -> _Scan:
    """Apply ``tp`` from ``start`` up to ``bound`` (exclusive), tracking key lifetimes.

    The partition is read in one pass, chunk by chunk; the logged micro-batch boundaries and
    processing times are reproduced (so processing-time timeouts end sessions where they did).
    """
    tracker = SpanTracker()
    tracker.watch = watch
    entries: dict[str, KeyEntry] = {}
    meta = PartitionMeta()
    segments, _ = plan_segments(log, tp, start, bound, None)
    segments = [s for s in segments if s.end > start] or [Segment(0, start, bound, None)]
    records = 0
    index = 0

    def open_applier() -> OrderedApplier:
        return target.segment_applier(entries, tp, segments[index], meta, max_events=10)

    def close_applier(applier: OrderedApplier) -> None:
        nonlocal meta
        for key, changed in applier.changes().items():
            if changed is None:
                entries.pop(key, None)
                tracker.dropped(key)  # e.g. an inactivity timeout ended the session
            else:
                entries[key] = changed
        meta = applier.meta

    applier = open_applier()
    for chunk in read_chunks(target.source_options, tp, start, bound):
        for record in chunk:
            while index < len(segments) - 1 and record[0] >= segments[index].end:
                applier.finish()  # the batch ended before this record: its timers fired
                if applier.failed is not None:
                    return _Scan(tracker, records, applier.failed)
                close_applier(applier)
                index += 1
                applier = open_applier()
            key, starts = _identify(target, record)
            applier.apply((record,))
            if applier.failed is not None:
                return _Scan(tracker, records, applier.failed)
            records += 1
            if key is not None:
                entry = applier.entries.get(key)
                tracker.record(key, record[0], starts, isinstance(entry, KeyEntry))
    return _Scan(tracker, records, None)
