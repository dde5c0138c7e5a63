"""The snapshot/update session messages (the Kafka value contract) and their JSON codec.

The Kafka key is the session id (UTF-8); the value is one JSON object tagged by ``type``::

    {"type":"snapshot","session":"S","seq":0,"ts":1731000000.5,"rows":[{"id":"r1",...},...]}
    {"type":"insert",  "session":"S","seq":N,"ts":...,"row":{"id":"r9",...}}
    {"type":"update",  "session":"S","seq":N,"ts":...,"row":{"id":"r9",...}}
    {"type":"delete",  "session":"S","seq":N,"ts":...,"id":"r9"}
    {"type":"end",     "session":"S","seq":N,"ts":...}

Rows are JSON objects holding their key in the row key field (``id`` unless configured); a
delete names its row with the same field. ``ts`` (producer time, Unix seconds) is optional.
Fields the contract does not name are ignored, so producers can add some.

Pitfall: a row key may be a JSON string or integer; both are kept as strings (``"7"`` and ``7``
name the same row), because the change log's ``row_id`` column is a string.
"""

from __future__ import annotations

import threading
from typing import Any, TypeAlias

import msgspec

from inorder.codecs.base import DecodeError

#: The row key field when none is configured.
DEFAULT_ROW_KEY = "id"

Row: TypeAlias = dict[str, Any]


class Snapshot(msgspec.Struct, tag_field="type", tag="snapshot", gc=False):
    """The full table of a session; starts (or restarts) it."""

    session: str
    seq: int
    rows: list[Row]
    ts: float | None = None


class Insert(msgspec.Struct, tag_field="type", tag="insert", gc=False):
    """A new row."""

    session: str
    seq: int
    row: Row
    ts: float | None = None


class Update(msgspec.Struct, tag_field="type", tag="update", gc=False):
    """A full replacement of an existing row."""

    session: str
    seq: int
    row: Row
    ts: float | None = None


class Delete(msgspec.Struct, tag_field="type", tag="delete", gc=False):
    """The removal of an existing row, named by its key (the JSON field is the row key field)."""

    session: str
    seq: int
    id: str | int
    ts: float | None = None


class End(msgspec.Struct, tag_field="type", tag="end", gc=False):
    """The end of a session: its table is final and its state is dropped."""

    session: str
    seq: int
    ts: float | None = None


class Truncate(msgspec.Struct, tag_field="type", tag="truncate", gc=False):
    """The source emptied the session's table (Debezium ``op = "t"``). Not part of the JSON
    contract: envelopes produce it; it starts the session over, empty, like an empty snapshot,
    but its change row says ``truncate`` so history versions close as truncated."""

    session: str
    seq: int
    ts: float | None = None


#: Any session message.
SessionMessage: TypeAlias = Snapshot | Insert | Update | Delete | End | Truncate

#: Operations of a :class:`Change` (see its docstring).
CHANGE_OPS = frozenset(
    {"snapshot", "insert", "update", "delete", "end", "read", "upsert", "skip", "truncate"}
)


class Change(msgspec.Struct, gc=False):
    """A session operation decoded from an input envelope other than the JSON contract.

    ``op`` is one of :data:`CHANGE_OPS`: the contract's five operations, plus ``read`` (one row
    of a snapshot delivered row by row: the first of a run starts the snapshot, the others add
    to it; ``snapshot_last`` ends the run), ``upsert`` (a row that replaces or adds, as an
    incremental snapshot reads it) and ``skip`` (a record the envelope ignores by contract, e.g.
    a tombstone after a delete). ``seq`` is None when the envelope has no producer sequence;
    ``position`` is the source's order key where it has one (it must not go back).
    """

    op: str
    session: str
    seq: int | None = None
    row: Row | None = None
    rows: list[Row] | None = None
    row_id: str | int | None = None
    ts: float | None = None
    position: tuple[int | str, ...] | None = None
    snapshot_last: bool = False
    #: A ``skip`` for a Kafka tombstone (a null value after a delete, for compaction).
    tombstone: bool = False


_delete_types: dict[str, type[Delete]] = {}
_delete_lock = threading.Lock()


def delete_type(row_key: str) -> type[Delete]:
    """The :class:`Delete` type whose row id is read from the JSON field ``row_key``.

    For the default ``id`` it is :class:`Delete` itself; otherwise a subclass (cached, and
    reachable as a module attribute so instances pickle by reference).
    """
    if row_key == DEFAULT_ROW_KEY:
        return Delete
    with _delete_lock:
        found = _delete_types.get(row_key)
        if found is None:
            qualname = _DELETE_PREFIX + row_key.encode("utf-8").hex()
            built: Any = msgspec.defstruct(
                "Delete",
                [("id", str | int)],
                bases=(Delete,),
                rename={"id": row_key},
                module=__name__,
            )
            built.__qualname__ = qualname
            _delete_types[row_key] = found = built
        return found


_DELETE_PREFIX = "_Delete_"


def __getattr__(name: str) -> Any:
    # Lets pickle find the Delete subclass of a custom row key by its qualified name.
    if name.startswith(_DELETE_PREFIX):
        try:
            row_key = bytes.fromhex(name[len(_DELETE_PREFIX) :]).decode("utf-8")
        except ValueError:
            pass
        else:
            return delete_type(row_key)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def row_id_of(row: Row, row_key: str) -> str | None:
    """The key of ``row`` as a string, or None if it has no string/integer ``row_key`` field."""
    value = row.get(row_key)
    kind = type(value)
    if kind is str:
        return value
    if kind is int:
        return str(value)
    return None


class SessionCodec:
    """Decodes Kafka values into :data:`SessionMessage` (fast: one msgspec pass per value).

    Raises :class:`~inorder.codecs.base.DecodeError` for a missing value, malformed JSON, an
    unknown ``type``, a missing or mistyped field, or a row without a string/integer row key.
    Picklable (the decoder is rebuilt lazily after unpickling).
    """

    def __init__(self, row_key: str = DEFAULT_ROW_KEY) -> None:
        if not isinstance(row_key, str) or not row_key:
            raise ValueError("row_key must be a non-empty string")
        self.row_key = row_key
        self._decoder: msgspec.json.Decoder[SessionMessage] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"row_key": self.row_key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.row_key = state["row_key"]
        self._decoder = None

    def __repr__(self) -> str:
        return f"SessionCodec(row_key={self.row_key!r})"

    def _build(self) -> msgspec.json.Decoder[SessionMessage]:
        union: Any = Snapshot | Insert | Update | delete_type(self.row_key) | End
        decoder: msgspec.json.Decoder[SessionMessage] = msgspec.json.Decoder(union)
        self._decoder = decoder
        return decoder

    def decode(self, value: bytes | None, key: bytes | None) -> SessionMessage:
        """Decode one Kafka value (``key`` is not needed: the session id is in the value)."""
        if value is None:
            raise DecodeError("empty value (tombstone): expected a session message")
        decoder = self._decoder or self._build()
        try:
            msg = decoder.decode(value)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"invalid session message: {exc}") from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"malformed JSON: {exc}") from None
        kind = type(msg)
        if kind is Insert or kind is Update:
            if row_id_of(msg.row, self.row_key) is None:  # type: ignore[union-attr]
                raise DecodeError(
                    f"invalid session message: {msg.__struct_config__.tag} row has no "
                    f"string or integer {self.row_key!r} field"
                )
        elif kind is Snapshot:
            row_key = self.row_key
            for i, row in enumerate(msg.rows):  # type: ignore[union-attr]
                if row_id_of(row, row_key) is None:
                    raise DecodeError(
                        f"invalid session message: snapshot row {i} has no "
                        f"string or integer {row_key!r} field"
                    )
        return msg
