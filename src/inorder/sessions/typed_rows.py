"""Typed session rows: the change-row type built from a user's row type, picklable by name."""

from __future__ import annotations

import threading
import typing
from datetime import datetime
from typing import Any

import msgspec

from inorder.errors import ConfigError
from inorder.references import import_reference

#: Columns of a change row in front of the row data (both modes).
CHANGE_COLUMNS = ("kafka_ts", "session", "seq", "op", "row_id")
_FORBIDDEN_ROW_FIELDS = frozenset(CHANGE_COLUMNS) | {"topic", "partition", "offset", "batch_id"}

_typed_lock = threading.Lock()
_typed_types: dict[str, type[Any]] = {}
_TYPED_PREFIX = "_SessionChange_"


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
            return typed_change_type(import_reference(ref, "row_type"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CHANGE_COLUMNS", "row_fields", "typed_change_type"]
