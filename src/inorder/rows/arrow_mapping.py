"""Python types -> Arrow types, with value converters compiled once per type.

The mapping table is in :mod:`inorder.schema`'s docstring and ``docs/types.md``. Values are
never coerced (:mod:`inorder.value_fit`).
"""

from __future__ import annotations

import datetime as dt
import enum
import operator
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import pyarrow as pa

from inorder.errors import ConfigError
from inorder.records import BATCH_ID_FIELD, ORIGIN_FIELDS
from inorder.rows.record_types import FieldSpec, Precision, is_record_type, record_fields, type_name
from inorder.value_fit import Fit, fit_for

T = TypeVar("T")

#: Arrow type of a plain ``Decimal`` field (no :class:`Precision` annotation).
DEFAULT_DECIMAL = pa.decimal128(38, 9)

#: Column names inorder adds to every output row; an output type must not define them.
RESERVED_COLUMNS = ("topic", "partition", "offset", "batch_id")

Conv = Callable[[Any], Any]
_NONE = frozenset({type(None)})


class RowError(ValueError):
    """A row value does not fit the output schema (e.g. ``None`` in a non-nullable field).

    ``field`` is the dotted path of the field, ``row`` the index of the offending row in the
    encoded sequence (or ``None`` when pyarrow could not say which row).
    """

    def __init__(self, message: str, field: str, row: int | None) -> None:
        super().__init__(message)
        self.field = field
        self.row = row


# ---------------------------------------------------------------------------------------------
# Type -> Arrow mapping, with value converters compiled per type


@dataclass(slots=True)
class Node:
    """How one Python type maps to Arrow.

    ``enc`` turns a non-None Python value into what ``pa.array`` accepts (``None``: as is);
    ``dec`` turns a non-None value from ``to_pylist`` back (``None``: as is).
    """

    type: pa.DataType
    nullable: bool
    enc: Conv | None
    dec: Conv | None
    fit: Fit | None = None
    """For primitive fields: which Python values fit the column exactly (none are coerced)."""


_PRIMITIVES: dict[Any, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    bytes: pa.binary(),
    dt.datetime: pa.timestamp("us", tz="UTC"),
    dt.date: pa.date32(),
    Decimal: DEFAULT_DECIMAL,
}

_HINTS: dict[Any, str] = {
    set: "use list[...]",
    frozenset: "use list[...]",
    tuple: "use tuple[X, ...] or a dataclass",
    Any: "give the field a concrete type",
    object: "give the field a concrete type",
    dt.timedelta: "store it as a float of seconds or an int of microseconds",
    dt.time: "store it as a str or an int of microseconds",
    list: "give the element type, e.g. list[int]",
    dict: "give key and value types, e.g. dict[str, int]",
    complex: "store real and imaginary parts as two float fields",
}


class _Mapper:
    """Maps the types under one root record type, naming the field path in errors."""

    def __init__(self, root: type[Any]) -> None:
        self.root = root
        self.stack: list[type[Any]] = []

    def fail(self, path: str, tp: Any, hint: str | None = None) -> ConfigError:
        if hint is None:
            origin = get_origin(tp) or tp
            args = get_args(tp)
            if origin in (set, frozenset) and len(args) == 1:
                hint = f"use list[{type_name(args[0])}]"
            else:
                hint = _HINTS.get(origin, "see docs/types.md for the supported types")
        return ConfigError(
            f"{self.root.__qualname__}.{path}: cannot map type '{type_name(tp)}' to Arrow; {hint}"
        )

    def node(self, tp: Any, path: str) -> Node:
        origin = get_origin(tp)
        if origin is Union or origin is types.UnionType:
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                raise self.fail(path, tp, "a field may hold one type (optionally | None)")
            if len(args) == len(get_args(tp)):
                raise self.fail(path, tp, "a field may hold one type (optionally | None)")
            inner = self.node(args[0], path)
            enc, dec = inner.enc, inner.dec
            if enc is None and inner.fit is not None:
                return Node(inner.type, True, None, _none_passing(dec), inner.fit)
            return Node(inner.type, True, _none_passing(enc), _none_passing(dec))
        if origin is Annotated:
            return self.annotated(tp, path)
        if origin is Literal:
            return self.literal(tp, path)
        if origin in (list, tuple, Sequence):
            return self.sequence(tp, path)
        if origin is dict:
            return self.mapping(tp, path)
        if tp in _PRIMITIVES:
            return Node(_PRIMITIVES[tp], False, None, None, fit_for(tp, _PRIMITIVES[tp]))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self.enum(tp, path)
        if is_record_type(tp):
            return self.record(tp, path)
        raise self.fail(path, tp)

    def annotated(self, tp: Any, path: str) -> Node:
        base, *meta = get_args(tp)
        for m in meta:
            if isinstance(m, Precision):
                if base is not Decimal:
                    raise self.fail(path, tp, "Precision applies to Decimal fields only")
                if not 1 <= m.precision <= 38 or not 0 <= m.scale <= m.precision:
                    raise self.fail(path, tp, "need 1 <= precision <= 38, 0 <= scale <= precision")
                arrow = pa.decimal128(m.precision, m.scale)
                return Node(arrow, False, None, None, fit_for(Decimal, arrow))
            if isinstance(m, pa.DataType):
                if base not in _PRIMITIVES:
                    raise self.fail(path, tp, "an Arrow type override needs a primitive field")
                return Node(m, False, None, None, fit_for(base, m))
        return self.node(base, path)

    def literal(self, tp: Any, path: str) -> Node:
        values = get_args(tp)
        kinds = {type(v) for v in values}
        if kinds == {str}:
            arrow: pa.DataType = pa.string()
        elif kinds == {int}:
            arrow = pa.int64()
        else:
            raise self.fail(path, tp, "Literal values must be all str or all int")
        allowed = frozenset(values)
        owner = f"{self.root.__qualname__}.{path}"

        def check(v: Any) -> Any:
            if v not in allowed:
                raise ValueError(f"{owner}: {v!r} is not one of {sorted(allowed)!r}")
            return v

        return Node(arrow, False, check, None)

    def enum(self, tp: type[enum.Enum], path: str) -> Node:
        kinds = {type(m.value) for m in tp}
        if kinds <= {str}:
            arrow: pa.DataType = pa.string()
        elif kinds <= {int}:
            arrow = pa.int64()
        else:
            raise self.fail(path, tp, "Enum values must be all str or all int")

        def enc(v: Any) -> Any:
            return tp(v).value

        def dec(v: Any) -> Any:
            return tp(v)

        return Node(arrow, False, enc, dec)

    def sequence(self, tp: Any, path: str) -> Node:
        origin = get_origin(tp)
        args = get_args(tp)
        if origin is tuple:
            if len(args) != 2 or args[1] is not Ellipsis:
                raise self.fail(path, tp, "use tuple[X, ...] or a dataclass")
            args = args[:1]
        if len(args) != 1:
            raise self.fail(path, tp, "give the element type, e.g. list[int]")
        item = self.node(args[0], f"{path}[]")
        item_enc = checked(item, f"{self.root.__qualname__}.{path}[]")
        item_dec = item.dec
        arrow = pa.list_(pa.field("item", item.type, nullable=item.nullable))
        enc: Conv
        if item.enc is None and item.fit is not None:
            enc = _list_fitting(item.fit, item.nullable, f"{self.root.__qualname__}.{path}[]")
        elif item.enc is None and item.nullable:
            enc = _list_of(identity)
        elif item.enc is None:
            enc = _list_without_none(f"{self.root.__qualname__}.{path}[]")
        else:
            enc = _list_of(item_enc)
        dec: Conv | None
        if origin is tuple:
            dec = tuple if item_dec is None else _tuple_of(item_dec)
        else:
            dec = None if item_dec is None else _list_of(_none_passing(item_dec))
        return Node(arrow, False, enc, dec)

    def mapping(self, tp: Any, path: str) -> Node:
        args = get_args(tp)
        if len(args) != 2 or args[0] not in (str, int):
            raise self.fail(path, tp, "map keys must be str or int, e.g. dict[str, int]")
        key_type = _PRIMITIVES[args[0]]
        value = self.node(args[1], f"{path}{{}}")
        value_enc = checked(value, f"{self.root.__qualname__}.{path}{{}}")
        value_dec = _none_passing(value.dec)
        arrow = pa.map_(key_type, pa.field("value", value.type, nullable=value.nullable))

        def enc(v: Any) -> Any:
            return [(k, value_enc(x)) for k, x in v.items()]

        def dec(v: Any) -> Any:
            return {k: value_dec(x) for k, x in v}

        return Node(arrow, False, enc, dec)

    def record(self, tp: type[Any], path: str) -> Node:
        if tp in self.stack:
            raise self.fail(path, tp, "recursive types cannot be mapped to a table schema")
        self.stack.append(tp)
        try:
            fields = record_fields(tp)
            children = [(f, self.node(f.type, f"{path}.{f.name}")) for f in fields]
        finally:
            self.stack.pop()
        arrow = pa.struct([pa.field(f.name, n.type, nullable=n.nullable) for f, n in children])
        getters = [
            (
                f.name,
                operator.attrgetter(f.name),
                checked(n, f"{self.root.__qualname__}.{path}.{f.name}"),
            )
            for f, n in children
        ]

        # Struct children are checked here, in Python, because pyarrow does not enforce the
        # nullability of struct children when it builds an array from Python objects.
        def enc(v: Any) -> Any:
            out = {}
            for name, get, conv in getters:
                out[name] = conv(get(v))
            return out

        build = constructor(tp, [(f, _none_passing(n.dec)) for f, n in children])
        return Node(arrow, False, enc, build)


def _none_passing(conv: Conv | None) -> Conv:
    if conv is None:
        return identity

    def f(v: Any) -> Any:
        return None if v is None else conv(v)

    return f


def identity(v: Any) -> Any:
    """The converter that leaves a value as it is."""
    return v


def _fitting(fit: Fit, path: str) -> Conv:
    """A converter that passes values of the column's kind and rejects the others."""
    kinds = fit.kinds

    def f(v: Any) -> Any:
        if type(v) in kinds and fit.bounds is None:
            return v
        problem = fit.problem(v)
        if problem is not None:
            raise TypeError(f"{path}: {problem}")
        return v

    return f


def _list_fitting(fit: Fit, nullable: bool, path: str) -> Conv:
    """A list of primitives: every item of the column's kind (checked at C speed first)."""
    allowed = fit.kinds | {type(None)} if nullable else fit.kinds
    item = _fitting(fit, path)

    def f(v: Any) -> Any:
        if isinstance(v, str | bytes):
            raise TypeError(f"expected a list, got {type(v).__name__}")
        if fit.bounds is None and set(map(type, v)) <= allowed:
            return v
        for x in v:
            if x is None:
                if not nullable:
                    raise NullValue(path)
                continue
            item(x)
        return v

    return f


def checked(node: Node, path: str) -> Conv:
    """Converter for a nested value: applies ``enc`` and rejects None where not nullable."""
    conv = node.enc
    if conv is None and node.fit is not None:
        conv = _fitting(node.fit, path)
    if node.nullable:
        return _none_passing(conv)

    def f(v: Any) -> Any:
        if v is None:
            raise NullValue(path)
        return v if conv is None else conv(v)

    return f


def _list_of(conv: Conv) -> Conv:
    def f(v: Any) -> Any:
        if isinstance(v, str | bytes):
            raise TypeError(f"expected a list, got {type(v).__name__}")
        return [conv(x) for x in v]

    return f


def _list_without_none(path: str) -> Conv:
    # Primitive items need no conversion; `None in v` runs in C, far faster than a loop.
    def f(v: Any) -> Any:
        if isinstance(v, str | bytes):
            raise TypeError(f"expected a list, got {type(v).__name__}")
        if None in v:
            raise NullValue(path)
        return v

    return f


def _tuple_of(conv: Conv) -> Conv:
    def f(v: Any) -> Any:
        return tuple(None if x is None else conv(x) for x in v)

    return f


class NullValue(Exception):
    """``None`` met in a non-nullable nested field at ``path`` (raised while encoding)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def constructor(tp: type[Any], fields: list[tuple[FieldSpec, Conv]]) -> Conv:
    """A function building ``tp`` from a dict of column values (for decoding)."""
    init = [(f.name, conv) for f, conv in fields if f.init]
    late = [(f.name, conv) for f, conv in fields if not f.init]

    def build(d: dict[str, Any]) -> Any:
        obj = tp(**{name: conv(d[name]) for name, conv in init})
        for name, conv in late:
            object.__setattr__(obj, name, conv(d[name]))
        return obj

    return build


def root_nodes(tp: type[Any]) -> list[tuple[FieldSpec, Node]]:
    """The fields of an output record type and their mapping; ConfigError if not a record."""
    if not is_record_type(tp):
        raise ConfigError(
            f"{type_name(tp)} is not a record type; output rows must be a dataclass, "
            "msgspec.Struct, NamedTuple or pydantic model"
        )
    mapper = _Mapper(tp)
    mapper.stack.append(tp)
    return [(f, mapper.node(f.type, f.name)) for f in record_fields(tp)]


def arrow_type(tp: Any) -> pa.DataType:
    """The Arrow type of one Python type annotation (a record type maps to a struct)."""
    holder = _Mapper(tp if isinstance(tp, type) else type(None))
    return holder.node(tp, "<value>").type


def arrow_schema(tp: type[Any]) -> pa.Schema:
    """The Arrow schema of a record type (dataclass, msgspec.Struct, NamedTuple, pydantic).

    Raises :class:`~inorder.errors.ConfigError` naming the class and field path of the first
    field whose type cannot be mapped.
    """
    return pa.schema([pa.field(f.name, n.type, nullable=n.nullable) for f, n in root_nodes(tp)])


def check_reserved(tp: type[Any], schema: pa.Schema) -> None:
    """Refuse an output type that defines a column inorder adds (topic, offset...)."""
    clash = [n for n in schema.names if n in RESERVED_COLUMNS]
    if clash:
        raise ConfigError(
            f"{tp.__qualname__}: field {clash[0]!r} clashes with a column inorder adds to every "
            f"output row ({', '.join(RESERVED_COLUMNS)}); rename it"
        )


def full_schema(row_schema: pa.Schema) -> pa.Schema:
    """The row schema between the origin columns and ``batch_id``."""
    return pa.schema([*ORIGIN_FIELDS, *row_schema, BATCH_ID_FIELD])


def output_schema(tp: type[Any]) -> pa.Schema:
    """Full output schema: ``ORIGIN_FIELDS`` + the row type's fields + ``BATCH_ID_FIELD``."""
    schema = arrow_schema(tp)
    check_reserved(tp, schema)
    return full_schema(schema)


def spark_schema(schema: pa.Schema) -> Any:
    """A pyspark ``StructType`` for an Arrow schema (e.g. for ``mapInArrow``).

    Timestamps with a time zone become Spark ``TimestampType``; nullability is kept.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def spark_ddl(schema: pa.Schema) -> str:
    """A Spark DDL string for an Arrow schema (``topic STRING NOT NULL,...``).

    DDL cannot express that list or map elements are never null, so that nullability is
    lost; pass :func:`spark_schema` where Spark accepts a ``StructType``.
    """
    ddl: str = spark_schema(schema).toDDL()
    return ddl
