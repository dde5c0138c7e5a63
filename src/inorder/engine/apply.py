"""The ordered-apply core: one topic-partition's records, in offset order, through a processor.

This module is pure Python (no Spark, no storage). The Spark task of the partition backend and
the plain-Python reference runner both drive :class:`OrderedApplier`, so their semantics
cannot diverge. Per record, in this order:

1. **Replay check.** A record at or below the partition's last consumed offset was already
   applied (a re-read after a restart): it is skipped silently and counted as ``replayed``.
   Gaps between offsets are normal (transaction markers, compaction) and not violations.
2. **Decode.** ``DecodeError`` is the ``undecodable`` violation (of ``record_key(kafka_key)``);
   another ``InorderError`` (a schema registry that is down) fails the batch: never a skip.
3. **Watermark.** The record's event time (``processor.event_time``) may raise the
   partition's watermark (max event time - lateness). Event-time timers whose deadline the
   new watermark reaches fire first, ordered by ``(deadline, key)``.
4. **Ignored keys.** Under ``restart_session`` a key that broke a rule is skipped until a
   message for which ``processor.starts_session(msg)`` is true.
5. **Sequence check** (``Integrity.strict(sequence_field=...)``): per key the field goes up by
   exactly one; a message that starts a session may restart it. Otherwise ``sequence_gap``
   (skipped ahead), ``sequence_repeat`` (same or lower) or ``sequence_missing``.
6. **process.** A :class:`~inorder.processor.Violation` it raises discards the rows of that
   call and leaves the key's state as it was (under ``dead_letter`` the state is copied
   before the call to make that true; ``fail`` stops and ``restart_session`` drops it anyway);
   a fatal one stops whatever the policy. A :class:`~inorder.processor.Duplicate` (a source's
   redelivery) skips the record, counted as ``duplicates``: no rows, no violation.

Processing-time timers fire in :meth:`OrderedApplier.finish` for deadlines at or before the
batch's processing time; a timeout's rows carry the offset of the last record of its key.
An exception other than ``Violation`` from user code is a bug, not a data problem: it stops
the partition with the ``processor_error`` rule whatever the policy (skipping records
because of a bug would lose them silently).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from inorder.codecs.base import Codec, DecodeError
from inorder.engine.apply_results import ApplyResults, row_checker
from inorder.engine.context import (
    EVENT_TIME,
    PROCESSING_TIME,
    TIMER_CLEAR,
    TIMER_SET,
    EngineContext,
    delta_micros,
    to_micros,
)
from inorder.engine.reorder import FuzzyTier
from inorder.engine.timers import TimerQueue, is_live
from inorder.engine.violations import ROW_SCHEMA, DeadLetter, ViolationEvent
from inorder.errors import InorderError
from inorder.integrity import Integrity
from inorder.processor import Duplicate, Processor, Violation
from inorder.records import RecordTuple
from inorder.state.entry import KeyEntry, PartitionMeta, StateView

#: A record followed by its partition's watermark (external-watermark mode).
WatermarkedRecord = tuple[int, bytes | None, bytes | None, int | None, Any, int | None]


_ABSENT: Any = object()  # loaded from the view and found missing: nothing to write back
_MISSING: Any = object()  # not looked up yet


def _has_own(processor: Processor[Any, Any, Any], name: str) -> bool:
    return getattr(type(processor), name) is not getattr(Processor, name)


class OrderedApplier(ApplyResults):
    """Applies the records of ONE topic-partition, in offset order, for one micro-batch.

    Feed records with :meth:`apply` (any number of calls), then call :meth:`finish` once.
    Besides the :class:`ApplyResults`: :attr:`entries` (keys touched: new :class:`KeyEntry`,
    or ``None`` for deleted; entries equal to ``_ABSENT`` are skipped by :meth:`changes`) and
    :attr:`meta` (the partition's progress).
    """

    def __init__(
        self,
        processor: Processor[Any, Any, Any],
        codec: Codec[Any],
        integrity: Integrity,
        view: StateView,
        topic: str,
        partition: int,
        batch_id: int,
        processing_time: datetime | int,
        meta: PartitionMeta,
        *,
        max_events: int | None = None,
        copy_state: Callable[[Any], Any] = copy.deepcopy,
        external_watermark: bool = False,
    ) -> None:
        super().__init__(topic, partition, type(processor).__name__, max_events)
        self.processor = processor
        self.codec = codec
        self.integrity = integrity
        self.view = view
        self.batch_id = batch_id
        self.processing_us = (
            processing_time if isinstance(processing_time, int) else to_micros(processing_time)
        )
        self.meta = meta
        self.copy_state = copy_state
        self.ctx = EngineContext(topic, partition, batch_id, self.processing_us)
        self._lateness = delta_micros(integrity.lateness)
        if meta.max_event_us is not None:
            self.ctx._watermark_us = meta.max_event_us - self._lateness
        self._custom_event_time = _has_own(processor, "event_time")
        self._seq_field = integrity.sequence_field if integrity.tier != "none" else None
        self._policy = integrity.on_violation
        # Fuzzy tier: records wait in the partition's reorder buffer (kept in state).
        self._fuzzy = FuzzyTier(self, view) if integrity.tier == "fuzzy" else None
        # External watermark: records carry the watermark of their partition as a 6th
        # element (computed upstream over the whole partition, for key-group tasks).
        self._external_wm = external_watermark
        self._defer: list[tuple[int, str]] | None = None
        self._row_problem = row_checker(processor)

        self.entries: dict[str, Any] = {}

        # Timers: candidates per kind, checked against the key's entry when popped.
        self._timers = {
            PROCESSING_TIME: TimerQueue(view, PROCESSING_TIME),
            EVENT_TIME: TimerQueue(view, EVENT_TIME),
        }
        self._timers[EVENT_TIME].refill()
        self._et_hint = self._timers[EVENT_TIME].hint()

    # -- results -----------------------------------------------------------------------------

    def changes(self) -> dict[str, KeyEntry | None]:
        """Keys to write back: their new entry, or ``None`` to delete."""
        out = {k: v for k, v in self.entries.items() if v is not _ABSENT}
        if self._fuzzy is not None:
            out.update(self._fuzzy.changes())
        return out

    # -- state access ------------------------------------------------------------------------

    def _get(self, key: str) -> KeyEntry | None:
        entry = self.entries.get(key, _MISSING)
        if entry is _MISSING:
            loaded = self.view.load(key)
            self.entries[key] = _ABSENT if loaded is None else loaded
            return loaded
        return None if entry is _ABSENT else entry

    # -- timers ------------------------------------------------------------------------------

    def _fire_due(self, kind: int, upto: int) -> None:
        """Fire the timers of ``kind`` due at ``upto``, ordered by (deadline, key).

        The due set is fixed first: a timer set by ``on_timeout`` during this pass waits for
        the next opportunity (next watermark rise, or next batch), so a timeout that re-arms
        itself in the past cannot loop.
        """
        queue = self._timers[kind]
        due: list[tuple[int, str]] = []
        while queue.peek_due(upto) is not None:
            deadline, key = queue.pop()
            if is_live(self._get(key), deadline, kind) and (not due or due[-1] != (deadline, key)):
                due.append((deadline, key))
        for deadline, key in due:
            if self.failed is not None:
                return
            entry = self._get(key)
            if entry is not None and is_live(entry, deadline, kind):
                self._timeout(key, entry)
        if kind == EVENT_TIME:
            self._et_hint = queue.hint()

    def _timeout(self, key: str, entry: KeyEntry) -> None:
        ctx = self.ctx
        entry.timer = None
        self.entries[key] = entry
        ctx.set_record(entry.last_offset, entry.kafka_key, entry.last_ts, None)
        ctx.begin_call(key, ctx._watermark_us)
        self.counters["timeouts"] += 1
        snapshot = self.copy_state(entry.state) if self._policy == "dead_letter" else None
        try:
            produced = self.processor.on_timeout(entry.state, key, ctx)
            rows = list(produced) if produced is not None else []
            if rows:
                problem = self._row_problem(rows)
                if problem is not None:
                    raise Violation(ROW_SCHEMA, problem)
        except Violation as violation:
            if snapshot is not None:
                entry.state = snapshot
            self._violation(violation.rule, violation.detail, key, entry.last_offset, None, None)
            return
        except Exception as exc:
            self._bug(exc, key, entry.last_offset, "on_timeout")
            return
        self._emit(rows, entry.last_offset)
        self._after_call(key, entry)

    def _after_call(self, key: str, entry: KeyEntry) -> None:
        """Apply the requests the processor made during a successful call."""
        ctx = self.ctx
        if ctx._reset:
            self.entries[key] = None
            return
        op = ctx._timer_op
        if op == TIMER_SET:
            deadline = ctx._timer_deadline
            kind = ctx._timer_kind
            entry.timer = deadline
            entry.timer_kind = kind
            if self._defer is not None and kind == EVENT_TIME:
                # set by on_timeout during a release pass: waits for the next rise
                self._defer.append((deadline, key))
                return
            self._timers[kind].push(deadline, key)
            if kind == EVENT_TIME and (self._et_hint is None or deadline < self._et_hint):
                self._et_hint = deadline
        elif op == TIMER_CLEAR:
            entry.timer = None

    # -- outputs and violations --------------------------------------------------------------

    def _violation(
        self,
        rule: str,
        detail: str,
        key: str | None,
        offset: int,
        value: bytes | None,
        ts_us: int | None,
        kafka_key: bytes | None = None,
        policy: str | None = None,
    ) -> None:
        policy = policy or self._policy
        event = ViolationEvent(self.topic, self.partition, offset, key, rule, detail, policy)
        self._record_event(event)
        if policy == "fail":
            self.failed = event
        elif policy == "dead_letter":
            self.dead_letters.append(DeadLetter(offset, kafka_key, value, ts_us, key, rule, detail))
        elif key is not None:  # restart_session: drop the key, ignore it until a new session
            ctx = self.ctx
            ctx.begin_call(key, ctx._event_us)
            try:
                produced = self.processor.on_reset(key, Violation(rule, detail), ctx)
                rows = list(produced) if produced is not None else []
                problem = self._row_problem(rows) if rows else None
                if problem is not None:  # a reset's own rows: nothing to fall back on
                    raise TypeError(f"output row does not fit the output schema: {problem}")
            except Exception as exc:
                self._bug(exc, key, offset, "on_reset")
                return
            self._emit(rows, offset)
            self.entries[key] = KeyEntry(None, last_offset=offset, ignored=True)

    # -- the main loop -----------------------------------------------------------------------

    def apply(self, records: Iterable[RecordTuple] | Iterable[WatermarkedRecord]) -> None:
        """Apply records of this topic-partition, in offset order. Stops at a ``fail``.

        In external-watermark mode every record is a :data:`WatermarkedRecord`.
        """
        if self.failed is not None:
            return
        processor = self.processor
        decode = self.codec.decode
        ctx = self.ctx
        meta = self.meta
        custom_event_time = self._custom_event_time
        lateness = self._lateness
        external = self._external_wm
        fuzzy = self._fuzzy
        apply_msg = self._apply_msg
        last = meta.last_offset
        consumed = 0
        replayed = 0
        tuples: Iterable[tuple[Any, ...]] = records  # 5 or 6 long (external watermark)
        try:
            for rec in tuples:
                offset: int = rec[0]
                if offset <= last:
                    replayed += 1
                    continue
                last = offset
                consumed += 1
                if self.first_offset is None:
                    self.first_offset = offset
                kafka_key: bytes | None = rec[1]
                value: bytes | None = rec[2]
                ts_us: int | None = rec[3]
                ctx.set_record(offset, kafka_key, ts_us, rec[4])
                key: str | None = None
                try:
                    msg = decode(value, kafka_key)
                except DecodeError as exc:
                    self._undecodable(exc, offset, kafka_key, value, ts_us)
                    if self.failed is not None:
                        break
                    continue
                except InorderError as exc:
                    exc.args = (f"{self.topic}[{self.partition}] offset {offset}: {exc}",)
                    raise
                try:
                    if custom_event_time:
                        when = processor.event_time(msg, ctx)
                        event_us = None if when is None else to_micros(when)
                    else:
                        event_us = ts_us
                    watermark: int | None = None
                    if external:
                        watermark = rec[5]
                        if watermark is not None:
                            base = watermark + lateness
                            if meta.max_event_us is None or base > meta.max_event_us:
                                meta.max_event_us = base
                    elif event_us is not None and (
                        meta.max_event_us is None or event_us > meta.max_event_us
                    ):
                        meta.max_event_us = event_us
                        watermark = event_us - lateness
                    if watermark is not None and (
                        ctx._watermark_us is None or watermark > ctx._watermark_us
                    ):
                        ctx._watermark_us = watermark
                        hint = self._et_hint
                        if fuzzy is not None or (hint is not None and watermark >= hint):
                            self._advance(watermark)
                            if self.failed is not None:
                                break
                            ctx.set_record(offset, kafka_key, ts_us, rec[4])
                    key = processor.key(msg)
                    if fuzzy is not None:
                        fuzzy.arrive(key, offset, kafka_key, value, ts_us, rec[4], event_us)
                    else:
                        apply_msg(key, msg, offset, kafka_key, value, ts_us, event_us)
                except Exception as exc:
                    self._bug(exc, key, offset, "process")
                if self.failed is not None:
                    break
        finally:
            meta.last_offset = last
            self.counters["records"] += consumed
            self.counters["replayed"] += replayed

    def _apply_msg(
        self,
        key: str,
        msg: Any,
        offset: int,
        kafka_key: bytes | None,
        value: bytes | None,
        ts_us: int | None,
        event_us: int | None,
    ) -> None:
        processor = self.processor
        entry = self.entries.get(key, _MISSING)
        if entry is _MISSING:
            entry = self.view.load(key)
            if entry is None:
                entry = _ABSENT
            self.entries[key] = entry
        if entry is _ABSENT:
            entry = None
        starts: bool | None = None
        if entry is not None and entry.ignored:
            starts = processor.starts_session(msg)
            if not starts:
                self.counters["ignored"] += 1
                return
            entry = None
        seq: int | None = None
        seq_field = self._seq_field
        if seq_field is not None:
            raw = msg.get(seq_field) if isinstance(msg, dict) else getattr(msg, seq_field, None)
            if not isinstance(raw, int) or isinstance(raw, bool):
                self._violation(
                    "sequence_missing",
                    f"field {seq_field!r} is {raw!r}, not an integer",
                    key,
                    offset,
                    value,
                    ts_us,
                    kafka_key,
                )
                return
            seq = raw
            if entry is not None and entry.seq is not None and seq != entry.seq + 1:
                if starts is None:
                    starts = processor.starts_session(msg)
                if not starts:
                    rule = "sequence_gap" if seq > entry.seq + 1 else "sequence_repeat"
                    self._violation(
                        rule,
                        f"{seq_field} {seq} after {entry.seq}",
                        key,
                        offset,
                        value,
                        ts_us,
                        kafka_key,
                    )
                    return
        fresh = entry is None
        if entry is None:
            entry = KeyEntry(processor.initial_state(key))
        snapshot = (
            self.copy_state(entry.state) if not fresh and self._policy == "dead_letter" else None
        )
        ctx = self.ctx
        ctx.begin_call(key, event_us)
        try:
            produced = processor.process(entry.state, msg, ctx)
            rows = list(produced) if produced is not None else []
            if rows:
                problem = self._row_problem(rows)
                if problem is not None:
                    raise Violation(ROW_SCHEMA, problem)
        except Duplicate:
            if snapshot is not None:
                entry.state = snapshot
            self.counters["duplicates"] += 1
            return
        except Violation as v:
            if snapshot is not None:
                entry.state = snapshot
            policy = "fail" if v.fatal else None  # a fatal rule is never set aside
            self._violation(v.rule, v.detail, key, offset, value, ts_us, kafka_key, policy)
            return
        self._emit(rows, offset)
        entry.last_offset = offset
        entry.last_ts = ts_us
        entry.kafka_key = kafka_key
        if seq is not None:
            entry.seq = seq
        self.entries[key] = entry
        self._after_call(key, entry)

    def finish(self, final_watermark_us: int | None = None) -> None:
        """End of the batch: fire processing-time timers due at the batch's processing time.

        ``final_watermark_us`` (external-watermark mode) is the partition's watermark at the
        end of the batch: event-time timers and buffered records it reaches go first.
        """
        ctx = self.ctx
        if self.failed is None and final_watermark_us is not None:
            base = final_watermark_us + self._lateness
            if self.meta.max_event_us is None or base > self.meta.max_event_us:
                self.meta.max_event_us = base
            if ctx._watermark_us is None or final_watermark_us > ctx._watermark_us:
                ctx._watermark_us = final_watermark_us
                self._advance(final_watermark_us)
        if self.failed is None:
            self._fire_due(PROCESSING_TIME, self.processing_us)

    # -- undecodable records, ignored keys, the fuzzy tier ------------------------------

    def _undecodable(
        self,
        exc: DecodeError,
        offset: int,
        kafka_key: bytes | None,
        value: bytes | None,
        ts_us: int | None,
    ) -> None:
        try:
            blamed = self.processor.record_key(kafka_key)
        except Exception:
            blamed = None
        if self._skip_ignored(blamed):
            return
        self._violation("undecodable", str(exc), blamed, offset, value, ts_us, kafka_key)

    def _skip_ignored(self, key: str | None) -> bool:
        """Under restart_session, a fault of a key already waiting for a new session is
        ignored like any other record of its broken session (one fault, one reset)."""
        if key is None or self._policy != "restart_session":
            return False
        entry = self._get(key)
        if entry is not None and entry.ignored:
            self.counters["ignored"] += 1
            return True
        return False

    def _advance(self, watermark: int) -> None:
        """The watermark reached ``watermark``: fire event-time timers (and release records)."""
        if self._fuzzy is not None:
            self._fuzzy.advance(watermark)
            return
        hint = self._et_hint
        if hint is not None and watermark >= hint:
            self._fire_due(EVENT_TIME, watermark)
