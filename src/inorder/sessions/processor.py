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

import importlib
import operator
import threading
import typing
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import msgspec

from inorder.durations import parse_duration
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.processor import Context, Processor, Violation
from inorder.sessions.messages import (
    DEFAULT_ROW_KEY,
    Delete,
    End,
    Insert,
    Row,
    SessionCodec,
    SessionMessage,
    Snapshot,
    Update,
    row_id_of,
)

#: Change-row operations (the ``op`` column).
OPS = ("insert", "update", "delete", "clear", "reset", "end")

#: ``seq`` of a ``reset`` row: a reset is not a producer message (its ``offset`` names the
#: record that broke the rule, or that could not be decoded).
RESET_SEQ = -1


class SessionState(msgspec.Struct):
    """Per-session state: table rows as canonical JSON, last ``seq``, snapshot seen."""

    started: bool = False
    seq: int = -1
    rows: dict[str, str] = {}


class SessionChange(msgspec.Struct, gc=False):
    """One applied row change. inorder adds ``topic, partition, offset`` before and
    ``batch_id`` after these columns."""

    kafka_ts: datetime | None
    session: str
    seq: int
    op: str
    row_id: str | None = None
    row: str | None = None


#: Columns of a change row in front of the row data (both modes).
CHANGE_COLUMNS = ("kafka_ts", "session", "seq", "op", "row_id")
_FORBIDDEN_ROW_FIELDS = frozenset(CHANGE_COLUMNS) | {"topic", "partition", "offset", "batch_id"}

_typed_lock = threading.Lock()
_typed_types: dict[str, type[Any]] = {}
_TYPED_PREFIX = "_SessionChange_"


def _import_reference(ref: str) -> Any:
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"row_type: expected 'module:Class', got {ref!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"row_type: cannot import module {module_name!r}: {exc}") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"row_type: module {module_name!r} has no {attribute!r}") from None
    return target


def row_fields(row_type: type[Any]) -> list[tuple[str, str, Any]]:
    """``(attribute, JSON name, annotation)`` of each field of a typed row.

    Raises :class:`ConfigError` unless ``row_type`` is a dataclass, ``msgspec.Struct`` or
    ``NamedTuple`` whose field names do not clash with the change columns.
    """
    try:
        info = msgspec.inspect.type_info(row_type)
    except Exception as exc:
        raise ConfigError(f"row_type {row_type!r}: not a usable record type: {exc}") from None
    if not isinstance(
        info,
        msgspec.inspect.DataclassType | msgspec.inspect.StructType | msgspec.inspect.NamedTupleType,
    ):
        raise ConfigError(
            f"row_type {row_type!r}: must be a dataclass, msgspec.Struct or NamedTuple"
        )
    hints = typing.get_type_hints(row_type, include_extras=True)
    fields = []
    for f in info.fields:
        if f.name in _FORBIDDEN_ROW_FIELDS:
            raise ConfigError(
                f"row_type {row_type.__qualname__}: field {f.name!r} clashes with a change-log "
                f"column ({', '.join(sorted(_FORBIDDEN_ROW_FIELDS))})"
            )
        fields.append((f.name, f.encode_name, hints[f.name]))
    return fields


def typed_change_type(row_type: type[Any]) -> type[Any]:
    """The change-row type for typed rows: the change columns, then one nullable column per
    row field (instead of the JSON ``row`` column). Cached; pickles by reference."""
    ref = f"{row_type.__module__}:{row_type.__qualname__}"
    with _typed_lock:
        found = _typed_types.get(ref)
        if found is not None:
            return found
    columns: list[tuple[str, Any] | tuple[str, Any, Any]] = [
        ("kafka_ts", datetime | None),
        ("session", str),
        ("seq", int),
        ("op", str),
        ("row_id", str | None, None),
    ]
    columns += [(name, tp | None, None) for name, _, tp in row_fields(row_type)]
    built = msgspec.defstruct(
        f"SessionChange{row_type.__name__}", columns, module=__name__, gc=False
    )
    # A reachable qualified name (see ``__getattr__`` below) lets rows and processors pickle
    # by reference in any process that can import the row type.
    built.__qualname__ = _TYPED_PREFIX + ref.encode("utf-8").hex()
    built.__doc__ = f"Change rows of session tables with {row_type.__qualname__} rows."
    with _typed_lock:
        return _typed_types.setdefault(ref, built)


def __getattr__(name: str) -> Any:
    if name.startswith(_TYPED_PREFIX):
        try:
            ref = bytes.fromhex(name[len(_TYPED_PREFIX) :]).decode("utf-8")
        except ValueError:
            pass
        else:
            return typed_change_type(_import_reference(ref))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

    Output: :class:`SessionChange` rows, or with ``row_type`` the type in :attr:`out_type`.
    Default codec :class:`SessionCodec`; default integrity strict with ``restart_session``.
    """

    def __init__(
        self,
        row_key: str = DEFAULT_ROW_KEY,
        inactivity_timeout: timedelta | str | None = None,
        row_type: type[Any] | str | None = None,
    ) -> None:
        if not isinstance(row_key, str) or not row_key:
            raise ConfigError("row_key: must be a non-empty string")
        if isinstance(inactivity_timeout, str):
            inactivity_timeout = parse_duration(inactivity_timeout)
        if inactivity_timeout is not None and inactivity_timeout <= timedelta(0):
            raise ConfigError("inactivity_timeout: must be positive")
        resolved: type[Any] | None = (
            _import_reference(row_type) if isinstance(row_type, str) else row_type
        )
        self.row_key = row_key
        self.inactivity_timeout = inactivity_timeout
        self.row_type: type[Any] | None = resolved
        #: The concrete output type (read by the engine instead of the generic argument).
        self.out_type: type[Any] = SessionChange
        self.msg_type: Any = SessionMessage
        self.state_type: type[SessionState] = SessionState
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
        return (type(self), (self.row_key, self.inactivity_timeout, self.row_type))

    def __repr__(self) -> str:
        return (
            f"SessionTables(row_key={self.row_key!r}, "
            f"inactivity_timeout={self.inactivity_timeout!r}, row_type={self.row_type!r})"
        )

    # -- defaults the pipeline asks for ------------------------------------------------------

    @classmethod
    def default_integrity(cls) -> Integrity:
        """Strict order; a violation resets the session until its next snapshot."""
        return Integrity.strict(on_violation="restart_session")

    def default_codec(self) -> SessionCodec:
        """The JSON codec for this processor's row key."""
        return SessionCodec(self.row_key)

    # -- Processor hooks ---------------------------------------------------------------------

    def key(self, msg: SessionMessage) -> str:
        """The session id."""
        return msg.session

    def initial_state(self, key: str) -> SessionState:
        """An unstarted session (its first message must be a snapshot)."""
        return SessionState()

    def record_key(self, kafka_key: bytes | None) -> str | None:
        """The Kafka key is the session id: an undecodable record resets that session."""
        if kafka_key is None:
            return None
        try:
            return kafka_key.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def starts_session(self, msg: SessionMessage) -> bool:
        """A snapshot starts (or restarts) a session."""
        return type(msg) is Snapshot

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
                    raise _missing("update_missing_row", msg, rid)
                op = "update"
            else:
                if rid in rows:
                    raise _existing(msg, rid)
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
                    raise _existing(msg, rid)
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
        if not state.started or msg.seq != state.seq + 1:
            raise self._sequence_violation(state, msg)
        if kind is End:
            return self._end(state, msg, ctx)
        if isinstance(msg, Delete):
            rid = _delete_id(msg)
            rows = state.rows
            if rid not in rows:
                raise _missing("delete_missing_row", msg, rid)
            del rows[rid]
            state.seq = msg.seq
            if self.inactivity_timeout is not None:
                ctx.set_timeout(self.inactivity_timeout)
            return [SessionChange(ctx.timestamp, msg.session, msg.seq, "delete", rid)]
        raise TypeError(f"not a session message: {msg!r}")

    def _sequence_violation(self, state: SessionState, msg: SessionMessage) -> Violation:
        """The rule a non-snapshot message breaks by its place in the session."""
        if not state.started:
            return Violation(
                "before_snapshot",
                f"session {msg.session!r}: {_tag(msg)} seq {msg.seq} before any snapshot",
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
                f"session {msg.session!r}: {_tag(msg)} seq {msg.seq}: row has no string or "
                f"integer {self.row_key!r} field",
            )
        return rid

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
            unknown = row.keys() - self._allowed
            raise Violation(
                "row_schema",
                f"session {msg.session!r}: {_tag(msg)} seq {msg.seq}: row {rid!r} has "
                f"field(s) not in {self.row_type.__qualname__}: "  # type: ignore[union-attr]
                f"{', '.join(sorted(unknown))}",
            )
        data = self._encode(row)
        try:
            # Decoding the canonical JSON is twice as fast as msgspec.convert on the dict.
            value = self._row_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise Violation(
                "row_schema",
                f"session {msg.session!r}: {_tag(msg)} seq {msg.seq}: row {rid!r} does not "
                f"fit {self.row_type.__qualname__}: {exc}",  # type: ignore[union-attr]
            ) from None
        return rid, data.decode(), value

    def _typed_change(
        self, ctx: Context, msg: SessionMessage, op: str, rid: str, value: Any
    ) -> Any:
        return self.out_type(ctx.timestamp, msg.session, msg.seq, op, rid, *self._columns(value))

    def _process_typed(self, state: SessionState, msg: SessionMessage, ctx: Context) -> list[Any]:
        kind = type(msg)
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
                raise _missing("update_missing_row", msg, rid)
            if kind is Insert and rid in rows:
                raise _existing(msg, rid)
            rows[rid] = text
            state.seq = msg.seq
            return [self._typed_change(ctx, msg, _tag(msg), rid, value)]
        if kind is Snapshot:
            new_rows: dict[str, str] = {}
            values = []
            for row in msg.rows:  # type: ignore[union-attr]
                rid, text, value = self._typed(msg, row)
                if rid in new_rows:
                    raise _existing(msg, rid)
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
            rid = _delete_id(msg)
            if rid not in rows:
                raise _missing("delete_missing_row", msg, rid)
            del rows[rid]
            state.seq = msg.seq
            return [self.out_type(ctx.timestamp, msg.session, msg.seq, "delete", rid)]
        raise TypeError(f"not a session message: {msg!r}")

    # -- materialization -----------------------------------------------------------------------

    def table(self, state: SessionState) -> dict[str, Row]:
        """The session's current table: ``{row_id: row}`` (decoded from the state)."""
        decode = msgspec.json.decode
        return {rid: decode(text) for rid, text in state.rows.items()}


def _tag(msg: SessionMessage) -> str:
    tag: str = msg.__struct_config__.tag  # type: ignore[assignment]
    return tag


def _delete_id(msg: Delete) -> str:
    rid = msg.id
    return rid if type(rid) is str else str(rid)


def _missing(rule: str, msg: SessionMessage, rid: str) -> Violation:
    return Violation(rule, f"session {msg.session!r}: {_tag(msg)} seq {msg.seq}: no row {rid!r}")


def _existing(msg: SessionMessage, rid: str) -> Violation:
    where = "listed twice in the snapshot" if type(msg) is Snapshot else "already present"
    return Violation(
        "insert_existing_row",
        f"session {msg.session!r}: {_tag(msg)} seq {msg.seq}: row {rid!r} {where}",
    )


__all__ = [
    "OPS",
    "RESET_SEQ",
    "SessionChange",
    "SessionState",
    "SessionTables",
    "row_fields",
    "typed_change_type",
]
