"""Debezium change events as session operations.

A Debezium value (the JSON converter's schemaless form, or ``{"schema":...,"payload":{...}}``)
carries ``op``, ``before``, ``after`` and ``source``; it maps onto the session operations as:

=====================  =================================================================
``op``                 operation
=====================  =================================================================
``r``                  ``read``: a snapshot read row by row (a run of them is one snapshot)
``r`` (incremental)    ``upsert`` (``source.snapshot`` = ``"incremental"``)
``c``                  ``insert`` of ``after``
``u``                  ``update``: ``after`` replaces the row
``d``                  ``delete`` of the row named by ``before`` (or by the Kafka key)
``t``                  ``truncate``: the table is emptied (history versions close as such)
``m``                  ``skip`` (a logical decoding message is no row change)
null value             ``skip`` (the tombstone Kafka compaction needs after a delete)
=====================  =================================================================

The session is the table (``source`` db, schema and table joined by ``.``; the fields are
configurable) or the Kafka key. ``source.snapshot`` ``"last"`` /
``"last_in_data_collection"`` ends a snapshot run. The source's order is kept as a position
for streamed events: PostgreSQL's ``source.sequence`` (last committed LSN, LSN), MySQL's
binlog ``(file, pos, row)``. An event at or below its session's last position is a
redelivery (Debezium is at-least-once), skipped as a duplicate (see
:mod:`inorder.sessions.envelope_apply`).

Pitfall: PostgreSQL's bare ``source.lsn`` and every ``ts_ms`` may go back between transactions
(changes are delivered in commit order, not in the order they were written; clocks move), so
neither is a position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from inorder.codecs.base import DecodeError
from inorder.errors import ConfigError
from inorder.sessions.messages import Change, Row, row_id_of

#: ``source`` fields a table session may be named by.
SOURCE_FIELDS = ("db", "schema", "table")
_SESSION_FROM = ("table", "key")
_LAST_MARKERS = frozenset({"last", "last_in_data_collection"})


class _Source(msgspec.Struct, gc=False):
    db: str | None = None
    schema: str | None = None
    table: str | None = None
    snapshot: str | bool | None = None
    sequence: str | None = None
    file: str | None = None
    pos: int | None = None
    row: int | None = None


class _Event(msgspec.Struct, gc=False):
    op: str | None = None
    before: Row | None = None
    after: Row | None = None
    source: _Source | None = None
    ts_ms: int | None = None
    # The JSON converter with schemas wraps the event: {"schema": ..., "payload": {...}}.
    payload: _Event | None = None


@dataclass(frozen=True)
class Debezium:
    """Debezium change events (see the module docstring for the mapping).

    * ``session``: ``"table"`` (default: one session per table, named by ``session_fields``
      of ``source`` joined by ``.``, e.g. ``inventory.public.customers``) or ``"key"`` (the
      Kafka key: its single field's value, else the key's canonical JSON).
    * ``session_fields``: which of ``db``, ``schema``, ``table`` name a table session.
    * ``require_snapshot``: when True a session's first event must be a snapshot read (as in
      the JSON contract); by default a table whose events begin with changes (a table created
      after the connector's snapshot, ``snapshot.mode=no_data``) starts empty.

    Pitfall: with ``session = "table"`` one table's events must all be in one partition
    (Debezium's default: one single-partition topic per table); tables are rebuilt per topic
    and session, so a table spread over partitions would be several partial tables.
    """

    session: str = "table"
    session_fields: tuple[str, ...] = SOURCE_FIELDS
    require_snapshot: bool = False

    def __post_init__(self) -> None:
        if self.session not in _SESSION_FROM:
            raise ConfigError(
                f"envelope.session: {self.session!r} is not one of {', '.join(_SESSION_FROM)}"
            )
        fields = tuple(self.session_fields)
        object.__setattr__(self, "session_fields", fields)
        unknown = [f for f in fields if f not in SOURCE_FIELDS]
        if not fields or unknown:
            raise ConfigError(
                f"envelope.session_fields: {list(fields)!r} must be a non-empty list of "
                f"{', '.join(SOURCE_FIELDS)}"
            )

    def codec(self, row_key: str) -> DebeziumCodec:
        """The codec reading these events, rows keyed by ``row_key``."""
        return DebeziumCodec(self, row_key)

    def record_session(self, kafka_key: bytes | None) -> str | None:
        """The session an undecodable record belongs to: known only when it is the key."""
        if self.session != "key" or kafka_key is None:
            return None
        try:
            return key_session(kafka_key)
        except DecodeError:
            return None


def key_session(kafka_key: bytes) -> str:
    """A session id from a Debezium key: its single field's value, else its canonical JSON."""
    payload = key_payload(kafka_key)
    if isinstance(payload, dict) and len(payload) == 1:
        (value,) = payload.values()
        if type(value) is str:
            return value
        if type(value) is int:
            return str(value)
    if payload is None:
        try:
            return kafka_key.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("Kafka key is neither JSON nor UTF-8 text") from None
    return msgspec.json.encode(payload, order="deterministic").decode()


def key_payload(kafka_key: bytes) -> Any:
    """The Kafka key's JSON (unwrapped from ``{"schema":...,"payload":...}``), or None."""
    try:
        key = msgspec.json.decode(kafka_key)
    except msgspec.DecodeError:
        return None
    if isinstance(key, dict) and "payload" in key and "schema" in key:
        return key["payload"]
    return key


class DebeziumCodec:
    """Decodes Debezium values into :class:`~inorder.sessions.messages.Change` operations.

    Raises :class:`~inorder.codecs.base.DecodeError` for malformed JSON, an unknown ``op``, a
    missing ``after``/``source``, or a row without a string/integer row key. Picklable.
    """

    def __init__(self, envelope: Debezium, row_key: str) -> None:
        self.envelope = envelope
        self.row_key = row_key
        self._decoder = msgspec.json.Decoder(_Event)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.envelope, self.row_key))

    def __repr__(self) -> str:
        return f"DebeziumCodec({self.envelope!r}, row_key={self.row_key!r})"

    def decode(self, value: bytes | None, key: bytes | None) -> Change:
        """Decode one Debezium record (``key`` names the session or a deleted row if needed)."""
        if value is None:  # the tombstone after a delete: skipped by contract
            session = self.envelope.record_session(key) if key is not None else None
            return Change("skip", session or "", tombstone=True)
        try:
            event = self._decoder.decode(value)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"invalid Debezium event: {exc}") from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"malformed JSON: {exc}") from None
        if event.payload is not None:
            event = event.payload
        op = event.op
        source = event.source
        if op is None:
            raise DecodeError("invalid Debezium event: no 'op' (expected c, u, d, r, t or m)")
        if op == "m":
            return Change("skip", self._session(source, key, op))
        session = self._session(source, key, op)
        if op == "c" or op == "u":
            return Change(
                "insert" if op == "c" else "update",
                session,
                row=self._after(event, op),
                position=_position(source),
            )
        if op == "d":
            return Change(
                "delete", session, row_id=self._deleted(event, key), position=_position(source)
            )
        if op == "r":
            marker = source.snapshot if source is not None else None
            row = self._after(event, op)
            if marker == "incremental":
                return Change("upsert", session, row=row)
            return Change("read", session, row=row, snapshot_last=marker in _LAST_MARKERS)
        if op == "t":
            return Change("truncate", session, position=_position(source))
        raise DecodeError(
            f"invalid Debezium event: unknown op {op!r} (expected c, u, d, r, t or m)"
        )

    def _session(self, source: _Source | None, key: bytes | None, op: str) -> str:
        envelope = self.envelope
        if envelope.session == "key":
            if key is None:
                raise DecodeError(f"Debezium {op!r} event without a Kafka key (the session)")
            return key_session(key)
        if source is None:
            raise DecodeError(f"invalid Debezium event: {op!r} without 'source' (the table)")
        parts = [getattr(source, name) for name in envelope.session_fields]
        named = [p for p in parts if p]
        if not named:
            raise DecodeError(
                f"invalid Debezium event: source has no {', '.join(envelope.session_fields)}"
            )
        return ".".join(named)

    def _after(self, event: _Event, op: str) -> Row:
        row = event.after
        if row is None:
            raise DecodeError(f"invalid Debezium event: {op!r} with null 'after'")
        if row_id_of(row, self.row_key) is None:
            raise DecodeError(
                f"invalid Debezium event: {op!r} row has no string or integer "
                f"{self.row_key!r} field"
            )
        return row

    def _deleted(self, event: _Event, key: bytes | None) -> str | int:
        # REPLICA IDENTITY NOTHING leaves 'before' empty: the Kafka key still names the row.
        for candidate in (event.before, key_payload(key) if key is not None else None):
            if isinstance(candidate, dict):
                rid = candidate.get(self.row_key)
                if type(rid) is str or type(rid) is int:
                    return rid
        raise DecodeError(
            f"invalid Debezium event: 'd' names no row (no {self.row_key!r} in 'before' or key)"
        )


def _position(source: _Source | None) -> tuple[int | str, ...] | None:
    if source is None:
        return None
    if source.sequence is not None:  # PostgreSQL: ["last committed LSN", "LSN"], either null
        try:
            pair = msgspec.json.decode(source.sequence)
        except msgspec.DecodeError:
            return None
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair):
            try:
                return (int(pair[0]), int(pair[1]))
            except ValueError:
                return None
        return None
    if source.file is not None and source.pos is not None:  # MySQL binlog
        # One binlog event may change several rows: ``row`` numbers them within it.
        return (source.file, source.pos, source.row or 0)
    return None


__all__ = ["SOURCE_FIELDS", "Debezium", "DebeziumCodec", "key_payload", "key_session"]
