"""``replay``: step through one topic-partition locally, printing every record and state change.

The records are applied by the engine's own apply core
(:class:`~inorder.engine.apply.OrderedApplier`), one record per call, over in-memory state,
with the real run's micro-batch boundaries and processing times when the checkpoint still
has them (so processing-time timeouts fire where they fired). For each record in the chosen
range it prints the offset, the state key, a summary of the decoded message, the rows it
produced and the key's state before and after (as a diff).

Breakpoints call :func:`breakpoint` (so ``PYTHONBREAKPOINT`` picks the debugger, and
``PYTHONBREAKPOINT=0`` turns them off) from a frame whose locals are ``msg`` (the decoded
message, ``None`` if it did not decode), ``state`` (the key's live state object, ``None`` for
a key without state), ``ctx`` (the engine's context, pointed at the record), ``key``,
``offset``, ``record`` and ``violation``. Offset and expression breakpoints stop *before* the
record is applied; violation breakpoints stop right after the record that broke a rule.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import msgspec

from inorder.checkpoint.state_files import load_partition_state, loadable_versions
from inorder.codecs.base import DecodeError
from inorder.engine.apply import OrderedApplier
from inorder.engine.context import from_micros
from inorder.engine.violations import ViolationEvent
from inorder.errors import ConfigError, InorderError
from inorder.ops.batchlog import Segment, load_batch_log
from inorder.ops.kafka_reads import read_chunks, watermarks
from inorder.ops.recompute import plan_segments
from inorder.ops.target import OpsTarget
from inorder.records import RecordTuple, TopicPartition
from inorder.state.entry import KeyEntry, PartitionMeta

_WIDTH = 160


@dataclass
class ReplayOptions:
    """What to replay and where to stop."""

    topic: str
    partition: int
    from_offset: int | None = None
    to_offset: int | None = None
    key: str | None = None
    break_at_offset: int | None = None
    break_on_violation: bool = False
    break_when: str | None = None
    from_version: int | str | None = None  # a batch id, or "auto"


@dataclass
class ReplaySummary:
    """What a replay did."""

    records: int = 0
    printed: int = 0
    stops: int = 0
    violations: list[ViolationEvent] = field(default_factory=list)
    started_from_version: int | None = None
    start_offset: int = 0
    failed: ViolationEvent | None = None


def to_plain(value: Any) -> Any:
    """A JSON-like copy of a message or state (dataclass, Struct, pydantic, dict...)."""
    if value is None:
        return None
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    try:
        return msgspec.to_builtins(value, builtin_types=(bytes,), str_keys=True)
    except TypeError:
        return repr(value)


def _flatten(value: Any, prefix: str, out: dict[str, Any], depth: int = 0) -> None:
    if isinstance(value, dict) and value and depth < 3:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1)
    else:
        out[prefix or "(state)"] = value


def state_diff(before: Any, after: Any) -> list[str]:
    """Changed paths between two plain states: ``path: old -> new``."""
    if before == after:
        return []
    if before is None or after is None:
        return [f"(state): {_short(before)} -> {_short(after)}"]
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(before, "", a)
    _flatten(after, "", b)
    lines = []
    for path in sorted(set(a) | set(b)):
        if path not in b:
            lines.append(f"{path}: {_short(a[path])} -> (removed)")
        elif path not in a:
            lines.append(f"{path}: (added) {_short(b[path])}")
        elif a[path] != b[path]:
            lines.append(f"{path}: {_short(a[path])} -> {_short(b[path])}")
    return lines


def _short(value: Any, width: int = 100) -> str:
    text = json.dumps(value, default=str, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


def _debug(
    msg: Any,
    state: Any,
    ctx: Any,
    key: str | None,
    offset: int,
    record: RecordTuple,
    violation: ViolationEvent | None,
    reason: str,
    out: TextIO,
) -> None:
    """Stop in the debugger; ``msg``, ``state``, ``ctx``, ``key``... are this frame's locals."""
    print(
        f"replay: stopped at offset {offset} ({reason}); locals: msg, state, ctx, key, offset, "
        "record, violation; 'c' continues",
        file=out,
        flush=True,
    )
    breakpoint()


class Replayer:
    """Replays one topic-partition of a pipeline (see the module docs)."""

    def __init__(self, target: OpsTarget, options: ReplayOptions, out: TextIO | None = None):
        self.target = target
        self.options = options
        self.out = out or sys.stdout
        self.tp = TopicPartition(options.topic, options.partition)
        self.summary = ReplaySummary()
        self._condition: Any = None
        if options.break_when:
            try:
                self._condition = compile(options.break_when, "--break-when", "eval")
            except SyntaxError as exc:
                raise ConfigError(f"--break-when: invalid expression: {exc.msg}") from None
        self.debug: Callable[..., None] = _debug

    # -- starting point ----------------------------------------------------------------------

    def _start(self, log: Any, low: int) -> tuple[int, dict[str, KeyEntry], PartitionMeta]:
        from inorder.state.codec import StateCodec

        wanted = self.options.from_version
        if wanted is None:
            return low, {}, PartitionMeta()
        versions = loadable_versions(self.target.engine.versions(self.tp))
        committed = [v for v in versions if (e := log.get(v)) is not None and e.committed]
        if wanted == "auto":
            limit = self.options.from_offset if self.options.from_offset is not None else 0
            fitting = [v for v in committed if log.get(v).end.get(self.tp, limit + 1) <= limit]
            if not fitting:
                return low, {}, PartitionMeta()
            version = max(fitting)
        else:
            version = int(wanted)
            if version not in versions:
                have = f"{versions[0]}..{versions[-1]}" if versions else "none"
                raise InorderError(
                    f"--from-checkpoint-version {version}: no loadable state version of {self.tp} "
                    f"(loadable: {have})"
                )
        state = load_partition_state(self.target.engine, self.tp, version)
        entry = log.get(version)
        start = (
            entry.end[self.tp]
            if entry is not None and self.tp in entry.end
            else state.meta.last_offset + 1
        )
        self.summary.started_from_version = version
        codec = StateCodec(self.target.types.state)
        return start, state.decoded(codec.decode), state.meta

    # -- running -----------------------------------------------------------------------------

    def run(self) -> ReplaySummary:
        """Replay until the end of the range (or Kafka's end); return what happened."""
        target, opts, tp = self.target, self.options, self.tp
        marks = watermarks(target.source_options, [tp])
        if tp not in marks:
            raise InorderError(f"topic {tp.topic!r} partition {tp.partition} not found in Kafka")
        low, high = marks[tp].low, marks[tp].high
        log = load_batch_log(target.layout, target.engine)
        start, entries, meta = self._start(log, low)
        end = high if opts.to_offset is None else min(high, opts.to_offset + 1)
        self.summary.start_offset = start
        segments, exact = plan_segments(log if log.batches else None, tp, start, end, None)
        if self.summary.started_from_version is not None:
            segments = [s for s in segments if s.batch_id > self.summary.started_from_version]
        if segments and segments[-1].end < end:
            last = segments[-1]
            segments.append(Segment(last.batch_id + 1, last.end, end, last.processing_time_us))
        elif not segments:
            segments = [Segment(0, start, end, None)]
        where = (
            f"state version {self.summary.started_from_version}"
            if self.summary.started_from_version is not None
            else "empty state"
        )
        self._say(
            f"replay {tp}: offsets {start}..{end - 1} from {where}; "
            + ("real batch boundaries" if exact else "one batch, processing-time timeouts off")
        )
        cursor = start
        for seg in segments:
            if cursor >= end or self.summary.failed is not None:
                break
            seg_end = min(seg.end, end)
            applier = target.segment_applier(entries, tp, seg, meta)
            stopped = False
            for records in read_chunks(
                target.source_options, tp, max(cursor, seg.start or 0), seg_end
            ):
                for record in records:
                    if not self._one(applier, entries, record):
                        stopped = True
                        break
                if stopped:
                    break
            if applier.failed is None:
                before = {k: to_plain(e.state) for k, e in entries.items() if e.timer is not None}
                applier.finish()
                self._timeouts(applier, entries, before, seg.batch_id)
            if applier.failed is not None:
                self.summary.failed = applier.failed
                self._say(f"STOP  {applier.failed.message()}")
                break
            for key, entry in applier.changes().items():
                if entry is None:
                    entries.pop(key, None)
                else:
                    entries[key] = entry
            meta = applier.meta
            cursor = max(cursor, seg_end)
        self._say(
            f"replayed {self.summary.records:,} records, printed {self.summary.printed:,}, "
            f"{len(self.summary.violations)} violation(s), {self.summary.stops} stop(s)"
        )
        return self.summary

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _current(self, applier: OrderedApplier, entries: dict[str, KeyEntry], key: str) -> Any:
        entry = applier.entries.get(key, None)
        if isinstance(entry, KeyEntry):
            return entry.state
        if key in applier.entries:
            return None  # deleted, or looked up and absent
        committed = entries.get(key)
        return None if committed is None else committed.state

    def _one(
        self, applier: OrderedApplier, entries: dict[str, KeyEntry], record: RecordTuple
    ) -> bool:
        opts = self.options
        offset, kafka_key, value, ts_us, headers = record
        processor = self.target.processor
        msg: Any = None
        key: str | None
        try:
            msg = self.target.codec.decode(value, kafka_key)
            key = processor.key(msg)
        except DecodeError:
            key = processor.record_key(kafka_key)
        except Exception:
            key = None
        if (
            key is not None
            and applier.entries.get(key, None) is None
            and key not in applier.entries
        ):
            # Load the committed entry into the batch so the live state object is shared.
            committed = entries.get(key)
            if committed is not None:
                applier.entries[key] = applier.view.load(key)
        state_obj = self._current(applier, entries, key) if key is not None else None
        before = to_plain(state_obj)
        in_range = (opts.from_offset is None or offset >= opts.from_offset) and (
            opts.to_offset is None or offset <= opts.to_offset
        )
        mine = in_range and (opts.key is None or key == opts.key)
        ctx = applier.ctx
        ctx.set_record(offset, kafka_key, ts_us, headers)
        if opts.break_at_offset is not None and offset == opts.break_at_offset:
            self.summary.stops += 1
            self.debug(
                msg, state_obj, ctx, key, offset, record, None, "--break-at-offset", self.out
            )
        elif self._condition is not None and mine:
            names = {"msg": msg, "state": state_obj, "ctx": ctx, "key": key, "offset": offset}
            try:
                hit = bool(eval(self._condition, {"__builtins__": __builtins__}, names))
            except Exception as exc:
                raise InorderError(
                    f"--break-when {opts.break_when!r} failed at offset {offset}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            if hit:
                self.summary.stops += 1
                self.debug(msg, state_obj, ctx, key, offset, record, None, "--break-when", self.out)
        seen = len(applier.violations)
        applier.apply([record])
        self.summary.records += 1
        rows, row_offsets = list(applier.rows), list(applier.row_offsets)
        applier.rows.clear()
        applier.row_offsets.clear()
        after_obj = self._current(applier, entries, key) if key is not None else None
        new_violations = applier.violations[seen:]
        self.summary.violations.extend(new_violations)
        if mine:
            self.summary.printed += 1
            self._print_record(offset, key, msg, rows, before, to_plain(after_obj), ts_us)
            for v in new_violations:
                self._say(f"      VIOLATION {v.rule} ({v.policy}): {v.detail}")
        if opts.break_on_violation and new_violations and (opts.key is None or key == opts.key):
            self.summary.stops += 1
            self.debug(
                msg,
                after_obj,
                ctx,
                key,
                offset,
                record,
                new_violations[0],
                "--break-on-violation",
                self.out,
            )
        del row_offsets
        if applier.failed is not None:
            return False
        return opts.to_offset is None or offset < opts.to_offset

    def _print_record(
        self,
        offset: int,
        key: str | None,
        msg: Any,
        rows: list[Any],
        before: Any,
        after: Any,
        ts_us: int | None,
    ) -> None:
        when = "" if ts_us is None else f" {from_micros(ts_us).isoformat(timespec='seconds')}"
        summary = "(undecodable)" if msg is None else _short(to_plain(msg), 110)
        self._say(f"{offset:>10}{when} key {key!r}: {type(msg).__name__} {summary}")
        if rows:
            shown = ", ".join(_short(to_plain(r), 60) for r in rows[:3])
            more = f" (+{len(rows) - 3} more)" if len(rows) > 3 else ""
            self._say(f"      -> {len(rows)} row(s): {shown}{more}")
        for line in state_diff(before, after)[:20]:
            self._say(f"      state {line}"[:_WIDTH])

    def _timeouts(
        self,
        applier: OrderedApplier,
        entries: dict[str, KeyEntry],
        before: dict[str, Any],
        batch_id: int,
    ) -> None:
        fired = applier.counters.get("timeouts", 0)
        rows = list(applier.rows)
        applier.rows.clear()
        applier.row_offsets.clear()
        if not fired and not rows:
            return
        self._say(f"      batch {batch_id} ended: {fired} timeout(s) fired, {len(rows)} row(s)")
        for key, old in before.items():
            if self.options.key is not None and key != self.options.key:
                continue
            new = to_plain(self._current(applier, entries, key))
            for line in state_diff(old, new)[:10]:
                self._say(f"      timeout {key!r} state {line}"[:_WIDTH])
