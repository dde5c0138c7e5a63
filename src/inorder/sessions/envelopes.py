"""Input envelopes: the message shapes :class:`~inorder.sessions.SessionTables` can read.

The JSON contract (:class:`~inorder.sessions.messages.SessionCodec`) is the default and stays
on its own fast path. The others decode into
:class:`~inorder.sessions.messages.Change` operations on the same sessions and tables:

* :class:`FieldMapping`: messages that say what the contract says under other names (the
  type field and its values, the session field or the Kafka key, the sequence field or none,
  the row and rows fields);
* :class:`~inorder.sessions.debezium.Debezium`: Debezium change events.

From TOML, ``[processor] options = { envelope = { kind = "fields", ... } }`` (or
``kind = "debezium"``); :func:`envelope_from_options` reads that table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeAlias

import msgspec

from inorder.codecs.base import DecodeError
from inorder.errors import ConfigError
from inorder.sessions.debezium import Debezium
from inorder.sessions.messages import Change, row_id_of

#: The contract's operations a :class:`FieldMapping` can rename.
OPERATIONS = ("snapshot", "insert", "update", "delete", "end")


class EnvelopeCodec(Protocol):
    """What an envelope's codec does: one Kafka record to one :class:`Change`."""

    def decode(self, value: bytes | None, key: bytes | None) -> Change:
        """Decode or raise :class:`~inorder.codecs.base.DecodeError`."""
        ...


@dataclass(frozen=True)
class FieldMapping:
    """Session messages with the contract's meaning under other field names and type values.

    * ``type_field`` and ``types``: the field naming the operation and, per operation
      (``snapshot``, ``insert``, ``update``, ``delete``, ``end``), the value that names it;
      operations not listed keep their contract name.
    * ``session_field``: the field holding the session id; None: the Kafka key (UTF-8).
    * ``seq_field``: the producer's per-session sequence; None when the producer has none
      (the sequence rules cannot be checked then, see docs/envelopes.md).
    * ``row_field`` / ``rows_field``: the row of an insert or update / the rows of a snapshot.
    * ``delete_field``: the field of a delete naming its row; None: the row key field
      (``SessionTables(row_key=...)``), at the top level or inside ``row_field``.
    * ``ts_field``: optional producer time (Unix seconds); None: not read.
    * ``require_snapshot``: a session's first message must be a snapshot (default, as in the
      contract); False: a session may begin with changes to an empty table.
    """

    type_field: str = "type"
    types: Mapping[str, str] = field(default_factory=dict)
    session_field: str | None = "session"
    seq_field: str | None = "seq"
    row_field: str = "row"
    rows_field: str = "rows"
    delete_field: str | None = None
    ts_field: str | None = "ts"
    require_snapshot: bool = True

    def __post_init__(self) -> None:
        unknown = sorted(set(self.types) - set(OPERATIONS))
        if unknown:
            raise ConfigError(
                f"envelope.types: {', '.join(unknown)} not an operation "
                f"(expected {', '.join(OPERATIONS)})"
            )
        names = {op: self.types.get(op, op) for op in OPERATIONS}
        if not all(isinstance(v, str) and v for v in names.values()):
            raise ConfigError(f"envelope.types: values must be non-empty strings, got {names}")
        if len(set(names.values())) != len(names):
            raise ConfigError(f"envelope.types: two operations share a value: {names}")
        object.__setattr__(self, "types", names)
        for name in ("type_field", "row_field", "rows_field"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"envelope.{name}: must be a non-empty string")

    def codec(self, row_key: str) -> FieldMappingCodec:
        """The codec reading these messages, rows keyed by ``row_key``."""
        return FieldMappingCodec(self, row_key)

    def record_session(self, kafka_key: bytes | None) -> str | None:
        """The session an undecodable record belongs to: known only when it is the key."""
        if self.session_field is not None or kafka_key is None:
            return None
        try:
            return kafka_key.decode("utf-8")
        except UnicodeDecodeError:
            return None


#: Any envelope other than the JSON contract.
Envelope: TypeAlias = FieldMapping | Debezium


class FieldMappingCodec:
    """Decodes field-mapped messages into :class:`Change` operations. Picklable."""

    def __init__(self, mapping: FieldMapping, row_key: str) -> None:
        self.mapping = mapping
        self.row_key = row_key
        self._ops = {value: op for op, value in mapping.types.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.mapping, self.row_key))

    def __repr__(self) -> str:
        return f"FieldMappingCodec({self.mapping!r}, row_key={self.row_key!r})"

    def decode(self, value: bytes | None, key: bytes | None) -> Change:
        """Decode one Kafka record or raise :class:`DecodeError` naming the field at fault."""
        if value is None:
            raise DecodeError("empty value (tombstone): expected a session message")
        try:
            obj = msgspec.json.decode(value)
        except msgspec.DecodeError as exc:
            raise DecodeError(f"malformed JSON: {exc}") from None
        if type(obj) is not dict:
            raise DecodeError(
                f"invalid session message: a JSON {type(obj).__name__}, not an object"
            )
        m = self.mapping
        tag = obj.get(m.type_field)
        op = self._ops.get(tag) if isinstance(tag, str) else None
        if op is None:
            raise DecodeError(
                f"invalid session message: {m.type_field!r} is {tag!r}, expected one of "
                f"{', '.join(repr(v) for v in m.types.values())}"
            )
        change = Change(op, self._session(obj, key), self._seq(obj), ts=self._ts(obj))
        if op == "insert" or op == "update":
            change.row = self._row(obj.get(m.row_field), f"{tag} {m.row_field!r}")
        elif op == "snapshot":
            rows = obj.get(m.rows_field)
            if type(rows) is not list:
                raise DecodeError(f"invalid session message: {tag} has no {m.rows_field!r} list")
            change.rows = [self._row(r, f"{tag} row {i}") for i, r in enumerate(rows)]
        elif op == "delete":
            change.row_id = self._delete_id(obj, tag)
        return change

    def _session(self, obj: dict[str, Any], key: bytes | None) -> str:
        name = self.mapping.session_field
        if name is None:
            if key is None:
                raise DecodeError("no Kafka key: the session id is the key")
            try:
                return key.decode("utf-8")
            except UnicodeDecodeError:
                raise DecodeError("Kafka key is not UTF-8: the session id is the key") from None
        session = obj.get(name)
        if type(session) is not str:
            raise DecodeError(f"invalid session message: {name!r} is {session!r}, not a string")
        return session

    def _seq(self, obj: dict[str, Any]) -> int | None:
        name = self.mapping.seq_field
        if name is None:
            return None
        seq = obj.get(name)
        if type(seq) is not int:
            raise DecodeError(f"invalid session message: {name!r} is {seq!r}, not an integer")
        return seq

    def _ts(self, obj: dict[str, Any]) -> float | None:
        name = self.mapping.ts_field
        ts = obj.get(name) if name is not None else None
        return float(ts) if type(ts) is int or type(ts) is float else None

    def _row(self, row: Any, where: str) -> dict[str, Any]:
        if type(row) is not dict:
            raise DecodeError(f"invalid session message: {where} is not an object")
        if row_id_of(row, self.row_key) is None:
            raise DecodeError(
                f"invalid session message: {where} has no string or integer {self.row_key!r} field"
            )
        return row

    def _delete_id(self, obj: dict[str, Any], tag: Any) -> str | int:
        name = self.mapping.delete_field or self.row_key
        rid = obj.get(name)
        if rid is None and self.mapping.delete_field is None:
            inner = obj.get(self.mapping.row_field)
            rid = inner.get(name) if type(inner) is dict else None
        if type(rid) is not str and type(rid) is not int:
            raise DecodeError(
                f"invalid session message: {tag} names no row (no string or integer {name!r})"
            )
        return rid


_NONE_ALLOWED = frozenset({"session_field", "seq_field", "delete_field", "ts_field"})


def envelope_from_options(options: Mapping[str, Any]) -> Envelope | None:
    """The envelope a TOML table (or dict) describes; ``kind`` is ``json`` (the contract:
    None), ``fields`` or ``debezium``. TOML has no null: ``false`` stands for None in
    ``session_field``, ``seq_field``, ``delete_field`` and ``ts_field``."""
    opts = dict(options)
    kind = opts.pop("kind", None)
    if kind == "json":
        if opts:
            raise ConfigError(f"envelope: kind 'json' takes no options, got {sorted(opts)}")
        return None
    cls: type[Any]
    if kind == "fields":
        cls = FieldMapping
    elif kind == "debezium":
        cls = Debezium
    else:
        raise ConfigError(f"envelope.kind: {kind!r} is not one of json, fields, debezium")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ConfigError(
            f"envelope ({kind}): unknown option(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))})"
        )
    for name in _NONE_ALLOWED & set(opts):
        if opts[name] is False:
            opts[name] = None
    if "session_fields" in opts:
        opts["session_fields"] = tuple(opts["session_fields"])
    envelope: Envelope = cls(**opts)
    return envelope


__all__ = [
    "OPERATIONS",
    "Envelope",
    "EnvelopeCodec",
    "FieldMapping",
    "FieldMappingCodec",
    "envelope_from_options",
]
