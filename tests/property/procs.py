"""Processors, codecs and record generators shared by the engine's tests.

Spark tasks unpickle these, so :func:`register_for_spark` makes cloudpickle ship this module
by value (test modules are not importable by Spark's Python workers).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from inorder.codecs.base import DecodeError
from inorder.processor import Context, Processor, Violation
from inorder.records import KafkaRecord


@dataclass
class Msg:
    """A test message: ``op`` drives what the processor does."""

    k: str
    v: int = 0
    seq: int = 0
    op: str = "add"


@dataclass
class Tally:
    """Per-key state."""

    n: int = 0
    total: int = 0
    history: list[int] = field(default_factory=list)


@dataclass
class Row:
    """An output row."""

    k: str
    kind: str
    n: int
    total: int
    note: str | None = None


class MsgCodec:
    """JSON -> Msg; anything else is undecodable."""

    def decode(self, value: bytes | None, key: bytes | None) -> Msg:
        try:
            d = json.loads(value or b"")
            return Msg(
                str(d["k"]), int(d.get("v", 0)), int(d.get("seq", 0)), str(d.get("op", "add"))
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"not a test message: {exc}") from None


class Tallier(Processor[Msg, Tally, Row]):
    """Counts and sums per key; ops exercise timers, violations, sessions and resets.

    ``add``: count, emit a row, arm an event-time timeout 10 s after the record.
    ``pt``: count, arm a processing-time timeout ``v`` seconds after the batch time.
    ``bad``: raise Violation (after mutating state: the engine must roll back).
    ``start``: a new session (restarts the sequence; ends an ignored period).
    ``end``: emit and reset the session.
    ``clear``: clear the timeout.
    """

    def key(self, msg: Msg) -> str:
        return msg.k

    def initial_state(self, key: str) -> Tally:
        return Tally()

    def record_key(self, kafka_key: bytes | None) -> str | None:
        return None if kafka_key is None else kafka_key.decode()

    def starts_session(self, msg: Msg) -> bool:
        return msg.op == "start"

    def process(self, state: Tally, msg: Msg, ctx: Context) -> Iterable[Row]:
        state.n += 1
        state.total += msg.v
        state.history.append(msg.v)
        if msg.op == "bad":
            raise Violation("bad_value", f"value {msg.v} is bad")
        if msg.op == "pt":
            ctx.set_timeout(timedelta(seconds=msg.v))
        elif msg.op == "end":
            ctx.reset_session()
        elif msg.op == "clear":
            ctx.clear_timeout()
        else:
            ctx.set_timeout(timedelta(seconds=10), event_time=True)
        yield Row(msg.k, msg.op, state.n, state.total, f"off={ctx.offset}")

    def on_timeout(self, state: Tally, key: str, ctx: Context) -> Iterable[Row]:
        wm = ctx.watermark
        yield Row(key, "timeout", state.n, state.total, None if wm is None else wm.isoformat())

    def on_reset(self, key: str, violation: Violation, ctx: Context) -> Iterable[Row]:
        yield Row(key, "reset", 0, 0, violation.rule)


class HeaderNote(Tallier):
    """Writes the record's headers into the row's note."""

    def process(self, state: Tally, msg: Msg, ctx: Context) -> Iterable[Row]:
        yield Row(msg.k, "headers", 0, 0, repr(list(ctx.headers)))


def record(
    offset: int,
    key: str,
    *,
    v: int = 0,
    seq: int = 0,
    op: str = "add",
    t: float = 0.0,
    topic: str = "t",
    partition: int = 0,
    raw: bytes | None = None,
    headers: tuple[tuple[str, bytes | None], ...] = (),
) -> KafkaRecord:
    """A record whose value is a test message (or ``raw`` bytes)."""
    value = (
        raw if raw is not None else json.dumps({"k": key, "v": v, "seq": seq, "op": op}).encode()
    )
    return KafkaRecord(
        topic, partition, offset, key.encode(), value, datetime.fromtimestamp(t, tz=UTC), headers
    )


def register_for_spark() -> None:
    """Ship this module's classes to Spark workers by value."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def as_comparable(rows: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as tuples in (batch, topic, partition) order, keeping order within each."""
    keyed = [
        (r["batch_id"], r["topic"], r["partition"], i, tuple(sorted(r.items())))
        for i, r in enumerate(rows)
    ]
    keyed.sort(key=lambda x: x[:4])
    return [x[4] for x in keyed]
