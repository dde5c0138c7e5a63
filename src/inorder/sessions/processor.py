"""``SessionTables``: the built-in processor that keeps each session's table and logs its changes.

One state per session id: the session's rows as canonical JSON strings (``{row_id: json}``),
its last applied ``seq`` and whether its snapshot has been seen. Every applied message yields
change rows (:class:`SessionChange`); applying a session's change rows in offset order rebuilds
its table exactly (:func:`inorder.sessions.rebuild_tables`).

Rules, checked before the state is touched (a violating message changes nothing):
``before_snapshot`` (any message before the session's first snapshot), ``seq_gap`` (``seq``
above last + 1), ``seq_repeat`` (same or lower ``seq``), ``insert_existing_row`` (also a row
listed twice in a snapshot), ``update_missing_row``, ``delete_missing_row`` and ``row_schema``
(a row without its key, or a typed row that does not fit its type).

A snapshot is always accepted (it restarts the session: new table, ``seq`` restarts from the
snapshot's). Undecodable values are the engine's ``undecodable`` rule; :meth:`record_key`
names the session from the Kafka key so that session is the one reset.

Pitfall: rows are stored and emitted as canonical JSON (keys sorted, compact), so the ``row``
column of two equal rows is byte-identical whatever key order the producer used.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from inorder.codecs.base import Codec
from inorder.durations import parse_duration
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.processor import Context, Processor, Violation
from inorder.references import import_reference
from inorder.sessions.envelope_apply import STARTING_OPS, check_position, settle, translate
from inorder.sessions.envelopes import Envelope, envelope_from_options
from inorder.sessions.messages import (
    DEFAULT_ROW_KEY,
    Change,
    Delete,
    End,
    Insert,
    Row,
    SessionCodec,
    SessionMessage,
    Snapshot,
    Truncate,
    Update,
    row_id_of,
)
from inorder.sessions.rules import delete_id, existing, missing, tag
from inorder.sessions.session_state import EnvelopeState, SessionState
from inorder.sessions.typed_rows import (
    row_fields,
    typed_change_type,
)

#: Change-row operations (the ``op`` column).
OPS = ("insert", "update", "delete", "clear", "reset", "end", "truncate")

#: The rule a typed row with fields its ``row_type`` lacks breaks: the run always stops.
SCHEMA_DRIFT = "schema_drift"

#: ``seq`` of a ``reset`` row: a reset is not a producer message (its ``offset`` names the
#: record that broke the rule, or that could not be decoded).
RESET_SEQ = -1


class SessionChange(msgspec.Struct, gc=False):
    """One applied row change. inorder adds ``topic, partition, offset`` before and
    ``batch_id`` after these columns."""

    kafka_ts: datetime | None
    session: str
    seq: int
    op: str
    row_id: str | None = None
    row: str | None = None


#: An envelope's message type, typed loosely: the contract's messages never are one.
_CHANGE: type[Any] = Change


class SessionTables(Processor[SessionMessage, SessionState, SessionChange]):
    """Session tables from snapshot/update messages (design §3), as a change log.

    Options:

    * ``row_key``: the row key field of rows and deletes (default ``id``).
    * ``inactivity_timeout``: end a session (``end`` row, state dropped) when no message came
      for this long, in processing time (a ``timedelta`` or text like ``"1 hour"``).
    * ``row_type``: a dataclass / ``msgspec.Struct`` / ``NamedTuple`` (or ``"module:Class"``)
      for the rows; the output then has one column per field instead of the JSON ``row``
      column, and a row that does not fit breaks the ``row_schema`` rule. Unknown fields do
      not fit (they would be dropped silently otherwise).
    * ``envelope``: the input's shape when it is not the JSON contract: a
      :class:`~inorder.sessions.envelopes.FieldMapping`, a
      :class:`~inorder.sessions.debezium.Debezium`, or their TOML table (docs/envelopes.md).

    Output: :class:`SessionChange` rows, or with ``row_type`` the type in :attr:`out_type`.
    Default codec :class:`SessionCodec`; default integrity strict with ``restart_session``.
    """

    def __init__(
        self,
        row_key: str = DEFAULT_ROW_KEY,
        inactivity_timeout: timedelta | str | None = None,
        row_type: type[Any] | str | None = None,
        envelope: Envelope | Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(row_key, str) or not row_key:
            raise ConfigError("row_key: must be a non-empty string")
        if isinstance(inactivity_timeout, str):
            inactivity_timeout = parse_duration(inactivity_timeout)
        if inactivity_timeout is not None and inactivity_timeout <= timedelta(0):
            raise ConfigError("inactivity_timeout: must be positive")
        resolved: type[Any] | None = (
            import_reference(row_type, "row_type") if isinstance(row_type, str) else row_type
        )
        if isinstance(envelope, Mapping):
            envelope = envelope_from_options(envelope)
        self.envelope: Envelope | None = envelope
        self.row_key = row_key
        self.inactivity_timeout = inactivity_timeout
        self.row_type: type[Any] | None = resolved
        #: The concrete output type (read by the engine instead of the generic argument).
        self.out_type: type[Any] = SessionChange
        self.msg_type: Any = SessionMessage
        self.state_type: type[SessionState] = SessionState
        if envelope is not None:
            self.msg_type = Change
            self.state_type = EnvelopeState
        self._json = msgspec.json.Encoder(order="deterministic")
        self._encode = self._json.encode
        self._allowed: frozenset[str] = frozenset()
        self._attrs: tuple[str, ...] = ()
        self._columns: Callable[[Any], tuple[Any, ...]] = tuple
        self._row_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
        if resolved is not None:
            fields = row_fields(resolved)
            self.out_type = typed_change_type(resolved)
            self._allowed = frozenset(json_name for _, json_name, _ in fields)
            self._attrs = tuple(name for name, _, _ in fields)
            getter = operator.attrgetter(*self._attrs)
            self._columns = (lambda v: (getter(v),)) if len(self._attrs) == 1 else getter
            self._row_decoder = msgspec.json.Decoder(resolved)
            if not any(json_name == row_key for _, json_name, _ in fields):
                raise ConfigError(
                    f"row_type {resolved.__qualname__}: has no field for the row key {row_key!r}"
                )

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.row_key, self.inactivity_timeout, self.row_type, self.envelope)
        return (type(self), args)

    def __repr__(self) -> str:
        return (
            f"SessionTables(row_key={self.row_key!r}, "
            f"inactivity_timeout={self.inactivity_timeout!r}, row_type={self.row_type!r}, "
            f"envelope={self.envelope!r})"
        )

    # -- defaults the pipeline asks for ------------------------------------------------------

    def default_integrity(self) -> Integrity:
        """Strict order; a violation resets the session until its next snapshot.

        Debezium input stops at a violation instead (``fail``): Debezium sends no new
        snapshot of a table by itself, so a reset table would ignore every later change.
        """
        if self._never_resnapshots():
            return Integrity.strict(on_violation="fail")
        return Integrity.strict(on_violation="restart_session")

    def check_integrity(self, integrity: Integrity) -> None:
        """Refuse ``restart_session`` for input that never sends a new snapshot by itself."""
        if integrity.on_violation == "restart_session" and self._never_resnapshots():
            raise ConfigError(
                "integrity.on_violation = 'restart_session': Debezium sends no new snapshot "
                "of a table by itself, so a session reset by a violation would ignore every "
                "later change of its table; use 'fail' (the default for Debezium: stop before "
                "committing the event) or 'dead_letter' (set the event aside, the table stays "
                "consistent, the run exits with code 3)"
            )

    def _never_resnapshots(self) -> bool:
        from inorder.sessions.debezium import Debezium

        return isinstance(self.envelope, Debezium)

    def identity_options(self) -> dict[str, str]:
        """``row_key``, ``row_type`` and the envelope: each changes how records read."""
        row_type = self.row_type
        return {
            "row_key": self.row_key,
            "row_type": ""
            if row_type is None
            else f"{row_type.__module__}:{row_type.__qualname__}",
            "envelope": "" if self.envelope is None else repr(self.envelope),
        }

    def default_codec(self) -> Codec[Any]:
        """The codec of this processor's envelope (the JSON contract's by default)."""
        if self.envelope is not None:
            return self.envelope.codec(self.row_key)
        return SessionCodec(self.row_key)

    # -- Processor hooks ---------------------------------------------------------------------

    def key(self, msg: SessionMessage) -> str:
        """The session id."""
        return msg.session

    def initial_state(self, key: str) -> SessionState:
        """An unstarted session (its first message must be a snapshot)."""
        return self.state_type()

    def record_key(self, kafka_key: bytes | None) -> str | None:
        """The Kafka key is the session id: an undecodable record resets that session."""
        if self.envelope is not None:
            return self.envelope.record_session(kafka_key)
        if kafka_key is None:
            return None
        try:
            return kafka_key.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def starts_session(self, msg: SessionMessage) -> bool:
        """A snapshot starts (or restarts) a session."""
        kind = type(msg)
        return kind is Snapshot or (kind is _CHANGE and msg.op in STARTING_OPS)  # type: ignore[union-attr]

    def on_reset(self, key: str, violation: Violation, ctx: Context) -> Iterable[SessionChange]:
        """One ``reset`` row (``seq`` = -1) at the offending record; the table is emptied."""
        if self.inactivity_timeout is not None:
            ctx.clear_timeout()
        return [self.out_type(ctx.timestamp, key, RESET_SEQ, "reset")]

    def on_timeout(self, state: SessionState, key: str, ctx: Context) -> Iterable[SessionChange]:
        """Inactivity: emit ``end`` (``seq`` = last applied) and drop the session."""
        ctx.reset_session()
        if not state.started:
            return ()
        return [self.out_type(ctx.timestamp, key, state.seq, "end")]

    def process(
        self, state: SessionState, msg: SessionMessage, ctx: Context
    ) -> Iterable[SessionChange]:
        """Check the message against the session's rules, apply it, return its change rows."""
        if self.row_type is not None:
            return self._process_typed(state, msg, ctx)
        # Hot path, kept in one function on purpose (each call costs ~0.1 us per message).
        kind = type(msg)
        if kind is Update or kind is Insert:
            if not state.started or msg.seq != state.seq + 1:
                raise self._sequence_violation(state, msg)
            row = msg.row  # type: ignore[union-attr]
            rid = row.get(self.row_key)
            if type(rid) is not str:
                rid = self._row_id(msg, row)
            rows = state.rows
            if kind is Update:
                if rid not in rows:
                    raise missing("update_missing_row", msg, rid)
                op = "update"
            else:
                if rid in rows:
                    raise existing(msg, rid)
                op = "insert"
            text = self._encode(row).decode()
            rows[rid] = text
            state.seq = seq = msg.seq
            if self.inactivity_timeout is not None:
                ctx.set_timeout(self.inactivity_timeout)
            return [SessionChange(ctx.timestamp, msg.session, seq, op, rid, text)]
        if kind is Snapshot:
            new_rows: dict[str, str] = {}
            encode = self._encode
            row_key = self.row_key
            for row in msg.rows:  # type: ignore[union-attr]
                rid = row.get(row_key)
                if type(rid) is not str:
                    rid = self._row_id(msg, row)
                if rid in new_rows:
                    raise existing(msg, rid)
                new_rows[rid] = encode(row).decode()
            state.rows = new_rows
            state.seq = seq = msg.seq
            state.started = True
            if self.inactivity_timeout is not None:
                ctx.set_timeout(self.inactivity_timeout)
            ts = ctx.timestamp
            session = msg.session
            out: list[SessionChange] = [SessionChange(ts, session, seq, "clear")]
            out += [SessionChange(ts, session, seq, "insert", r, t) for r, t in new_rows.items()]
            return out
        if kind is _CHANGE:
            return self._process_change(state, msg, ctx)  # type: ignore[arg-type]
        if kind is Truncate:
            return self._truncate(state, msg, ctx)
        if not state.started or msg.seq != state.seq + 1:
            raise self._sequence_violation(state, msg)
        if kind is End:
            return self._end(state, msg, ctx)
        if isinstance(msg, Delete):
            rid = delete_id(msg)
            rows = state.rows
            if rid not in rows:
                raise missing("delete_missing_row", msg, rid)
            del rows[rid]
            state.seq = msg.seq
            if self.inactivity_timeout is not None:
                ctx.set_timeout(self.inactivity_timeout)
            return [SessionChange(ctx.timestamp, msg.session, msg.seq, "delete", rid)]
        raise TypeError(f"not a session message: {msg!r}")

    def _process_change(self, state: SessionState, change: Change, ctx: Context) -> list[Any]:
        """An envelope's operation, as the contract messages it stands for."""
        envelope = self.envelope
        require = envelope.require_snapshot if envelope is not None else True
        check_position(state, change, self.row_key)  # type: ignore[arg-type]
        messages = translate(state, change, self.row_key, require)  # type: ignore[arg-type]
        if not messages and not state.started:
            ctx.reset_session()  # a skipped record must not leave an empty session behind
        out: list[Any] = []
        for msg in messages:
            out += self.process(state, msg, ctx)
        settle(state, change, self.row_key)  # type: ignore[arg-type]
        return out

    def _sequence_violation(self, state: SessionState, msg: SessionMessage) -> Violation:
        """The rule a non-snapshot message breaks by its place in the session."""
        if not state.started:
            return Violation(
                "before_snapshot",
                f"session {msg.session!r}: {tag(msg)} seq {msg.seq} before any snapshot",
            )
        expected = state.seq + 1
        detail = f"session {msg.session!r}: seq {msg.seq} after {state.seq} (expected {expected})"
        return Violation("seq_gap" if msg.seq > expected else "seq_repeat", detail)

    # -- application ---------------------------------------------------------------------------

    def _row_id(self, msg: SessionMessage, row: Row) -> str:
        rid = row_id_of(row, self.row_key)
        if rid is None:
            raise Violation(
                "row_schema",
                f"session {msg.session!r}: {tag(msg)} seq {msg.seq}: row has no string or "
                f"integer {self.row_key!r} field",
            )
        return rid

    def _truncate(self, state: SessionState, msg: SessionMessage, ctx: Context) -> list[Any]:
        # Always accepted, like a snapshot: the session goes on with an empty table.
        state.rows = {}
        state.seq = msg.seq
        state.started = True
        if self.inactivity_timeout is not None:
            ctx.set_timeout(self.inactivity_timeout)
        return [self.out_type(ctx.timestamp, msg.session, msg.seq, "truncate")]

    def _end(self, state: SessionState, msg: SessionMessage, ctx: Context) -> list[Any]:
        state.seq = msg.seq
        state.started = False
        ctx.reset_session()
        if self.inactivity_timeout is not None:
            ctx.clear_timeout()
        return [self.out_type(ctx.timestamp, msg.session, msg.seq, "end")]

    def _typed(self, msg: SessionMessage, row: Row) -> tuple[str, str, Any]:
        """Row id, canonical JSON and typed value of a row, or a ``row_schema`` violation."""
        rid = row.get(self.row_key)
        if type(rid) is not str:
            rid = self._row_id(msg, row)
        if not row.keys() <= self._allowed:
            # The source's schema changed: every later row has the new field too, so setting
            # this one aside (or resetting its session) would drop the rest of the table.
            unknown = ", ".join(sorted(row.keys() - self._allowed))
            name = self.row_type.__qualname__  # type: ignore[union-attr]
            raise Violation(
                SCHEMA_DRIFT,
                f"session {msg.session!r}: {tag(msg)} seq {msg.seq}: row {rid!r} has "
                f"field(s) not in row_type {name}: {unknown}; the source's schema changed: "
                f"add them to {name} (optional fields with a default are a compatible change) "
                "and run again; nothing from this record on was committed",
                fatal=True,
            )
        data = self._encode(row)
        try:
            # Decoding the canonical JSON is twice as fast as msgspec.convert on the dict.
            value = self._row_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise Violation(
                "row_schema",
                f"session {msg.session!r}: {tag(msg)} seq {msg.seq}: row {rid!r} does not "
                f"fit {self.row_type.__qualname__}: {exc}",  # type: ignore[union-attr]
            ) from None
        return rid, data.decode(), value

    def _typed_change(
        self, ctx: Context, msg: SessionMessage, op: str, rid: str, value: Any
    ) -> Any:
        return self.out_type(ctx.timestamp, msg.session, msg.seq, op, rid, *self._columns(value))

    def _process_typed(self, state: SessionState, msg: SessionMessage, ctx: Context) -> list[Any]:
        kind = type(msg)
        if kind is _CHANGE:
            return self._process_change(state, msg, ctx)  # type: ignore[arg-type]
        if kind is Truncate:
            return self._truncate(state, msg, ctx)
        if kind is not Snapshot and (not state.started or msg.seq != state.seq + 1):
            raise self._sequence_violation(state, msg)
        out = self._apply_typed(state, msg, ctx)
        if self.inactivity_timeout is not None and state.started:
            ctx.set_timeout(self.inactivity_timeout)
        return out

    def _apply_typed(self, state: SessionState, msg: SessionMessage, ctx: Context) -> list[Any]:
        kind = type(msg)
        rows = state.rows
        if kind is Update or kind is Insert:
            rid, text, value = self._typed(msg, msg.row)  # type: ignore[union-attr]
            if kind is Update and rid not in rows:
                raise missing("update_missing_row", msg, rid)
            if kind is Insert and rid in rows:
                raise existing(msg, rid)
            rows[rid] = text
            state.seq = msg.seq
            return [self._typed_change(ctx, msg, tag(msg), rid, value)]
        if kind is Snapshot:
            new_rows: dict[str, str] = {}
            values = []
            for row in msg.rows:  # type: ignore[union-attr]
                rid, text, value = self._typed(msg, row)
                if rid in new_rows:
                    raise existing(msg, rid)
                new_rows[rid] = text
                values.append((rid, value))
            state.rows = new_rows
            state.seq = msg.seq
            state.started = True
            out: list[Any] = [self.out_type(ctx.timestamp, msg.session, msg.seq, "clear")]
            out += [self._typed_change(ctx, msg, "insert", r, v) for r, v in values]
            return out
        if kind is End:
            return self._end(state, msg, ctx)
        if isinstance(msg, Delete):
            rid = delete_id(msg)
            if rid not in rows:
                raise missing("delete_missing_row", msg, rid)
            del rows[rid]
            state.seq = msg.seq
            return [self.out_type(ctx.timestamp, msg.session, msg.seq, "delete", rid)]
        raise TypeError(f"not a session message: {msg!r}")

    # -- materialization -----------------------------------------------------------------------

    def table(self, state: SessionState) -> dict[str, Row]:
        """The session's current table: ``{row_id: row}`` (decoded from the state)."""
        decode = msgspec.json.decode
        return {rid: decode(text) for rid, text in state.rows.items()}


__all__ = [
    "OPS",
    "RESET_SEQ",
    "SCHEMA_DRIFT",
    "SessionChange",
    "SessionState",
    "SessionTables",
    "row_fields",
    "typed_change_type",
]
