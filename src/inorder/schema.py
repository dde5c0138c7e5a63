"""Output rows as Arrow: derive the schema of a row type and encode rows column-wise.

A processor's ``Out`` type defines its output table. Supported record types are dataclasses,
``msgspec.Struct``, ``typing.NamedTuple`` and pydantic models (when pydantic is installed).
Field types map to Arrow as follows (see ``docs/types.md``):

========================================  ==========================================
Python                                     Arrow
========================================  ==========================================
``str``                                    ``string``
``int``                                    ``int64``
``float``                                  ``float64``
``bool``                                   ``bool``
``bytes``                                  ``binary``
``datetime``                               ``timestamp[us, tz=UTC]`` (naive means UTC)
``date``                                   ``date32``
``Decimal``                                ``decimal128(38, 9)``, or
                                           ``Annotated[Decimal, Precision(p, s)]``
``X | None`` / ``Optional[X]``             ``X``, nullable (all other fields are not)
``list[X]``, ``tuple[X, ...]``             ``list<X>``
``dict[str, X]``                           ``map<string, X>``
nested record type                         ``struct``
``Literal["a", "b"]``                      ``string`` (``int64`` for int literals)
``Enum``                                   its values: ``string`` (or ``int64``)
``Annotated[int, pa.int32()]``             the given Arrow type (primitive fields only)
========================================  ==========================================

Every output row also carries ``topic``, ``partition``, ``offset`` (first) and ``batch_id``
(last), added by the engine; an output type that defines one of those names is rejected.

Values are never coerced (:mod:`inorder.value_fit`): a ``float`` (even ``1.0``) or ``True``
in an ``int`` field, an ``int`` beyond the column's width, ``bytes`` in a ``str`` field or a
``datetime`` in a ``date`` field is an error naming the field, not a truncated value. An
``int`` in a ``float`` field is taken (Python's own promotion). A ``Decimal`` with more
fractional digits than the column's scale is an error, never silently rounded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import functools
import operator
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Generic, Literal, TypeVar, Union, get_args, get_origin

import msgspec
import pyarrow as pa

from inorder.errors import ConfigError
from inorder.records import BATCH_ID_FIELD, ORIGIN_FIELDS
from inorder.value_fit import Fit, fit_for

T = TypeVar("T")

#: Arrow type of a plain ``Decimal`` field (no :class:`Precision` annotation).
DEFAULT_DECIMAL = pa.decimal128(38, 9)

#: Column names inorder adds to every output row; an output type must not define them.
RESERVED_COLUMNS = ("topic", "partition", "offset", "batch_id")

_Conv = Callable[[Any], Any]
_NONE = frozenset({type(None)})


@dataclass(frozen=True, slots=True)
class Precision:
    """Decimal precision and scale: ``Annotated[Decimal, Precision(18, 2)]``."""

    precision: int
    scale: int


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
# Record types and their fields


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a record type.

    ``name`` is the Python attribute; ``stored_name`` the key it is serialised under (differs
    for msgspec Structs declared with ``rename=``).
    """

    name: str
    type: Any
    has_default: bool
    stored_name: str
    init: bool = True


def is_record_type(tp: Any) -> bool:
    """Whether ``tp`` is a dataclass, msgspec.Struct, NamedTuple or pydantic model class."""
    if not isinstance(tp, type):
        return False
    return (
        dataclasses.is_dataclass(tp)
        or issubclass(tp, msgspec.Struct)
        or _is_namedtuple(tp)
        or is_pydantic_model(tp)
    )


def _is_namedtuple(tp: type[Any]) -> bool:
    return issubclass(tp, tuple) and hasattr(tp, "_fields")


def is_pydantic_model(tp: Any) -> bool:
    """Whether ``tp`` is a pydantic (v2) model class; false when pydantic is not installed."""
    return (
        isinstance(tp, type)
        and hasattr(tp, "model_fields")
        and hasattr(tp, "model_validate")
        and hasattr(tp, "model_dump")
    )


def _type_hints(tp: type[Any]) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(tp, include_extras=True)
    except NameError as exc:
        # Forward references to names that are not importable from the class's module
        # (classes defined inside a function) cannot be resolved later either.
        raise ConfigError(
            f"{tp.__qualname__}: cannot resolve its type annotations ({exc}); "
            "define the types it uses at module level"
        ) from None
    _resolve_in_place(tp, hints)
    return hints


def _resolve_in_place(tp: type[Any], hints: dict[str, Any]) -> None:
    """Replace string annotations (``from __future__ import annotations``) by the types.

    Why: a class defined in a script's ``__main__`` or a notebook is pickled *by value* to
    Spark executors, where its module's globals do not exist; string annotations such as
    ``"dt.datetime"`` then cannot be resolved there, by inorder or by msgspec. Resolving them
    once on the driver, where they can be, makes the pickled class self-contained.
    """
    for klass in tp.__mro__:
        own = klass.__dict__.get("__annotations__")  # noqa: RUF063 - the class's own dict
        if not isinstance(own, dict) or not any(isinstance(v, str) for v in own.values()):
            continue
        if klass is not tp:
            try:
                base_hints = typing.get_type_hints(klass, include_extras=True)
            except NameError:
                continue
        else:
            base_hints = hints
        resolved = {k: base_hints.get(k, v) for k, v in own.items()}
        try:
            klass.__annotations__ = resolved
        except (AttributeError, TypeError):  # a class that forbids it: leave it as is
            continue


def prepare_for_pickling(*tps: Any) -> None:
    """Make user types safe to ship to Spark executors by value (call on the driver).

    Classes defined in a script's ``__main__`` or a notebook are pickled by value. Two things
    break that, and this fixes both for every record type reachable from ``tps``:

    * string annotations (``from __future__ import annotations``) cannot be resolved on an
      executor, where the defining module's globals are missing: they are resolved here;
    * msgspec caches its analysis of a dataclass on the class (``__msgspec_cache__``), an
      object cloudpickle cannot pickle: the cache is dropped (msgspec rebuilds it on use).

    Codecs, state codecs and row encoders call it when they are created and pickled.
    Idempotent and cheap.
    """
    seen: set[int] = set()
    for tp in tps:
        _prepare(tp, seen)


def check_portable(*tps: Any) -> None:
    """Raise ``ConfigError`` for a type that cannot be shipped to Spark executors.

    A ``msgspec.Struct`` class defined in ``__main__``, a notebook or any module pickled by
    value arrives broken in another process (its constructor accepts no fields; a known
    msgspec/cloudpickle limitation). Dataclasses work either way. Call on the driver at
    pipeline start with the message, state and output types.
    """
    seen: set[int] = set()
    for tp in tps:
        for klass in _reachable_types(tp, seen):
            if issubclass(klass, msgspec.Struct) and _pickled_by_value(klass):
                raise ConfigError(
                    f"{klass.__qualname__}: a msgspec.Struct defined in {klass.__module__!r} "
                    "cannot be sent to Spark executors (Structs do not survive pickling by "
                    "value); move it to an importable module or use a dataclass"
                )


def _pickled_by_value(klass: type[Any]) -> bool:
    try:
        from pyspark.cloudpickle import cloudpickle as cp

        by_reference: bool = cp._should_pickle_by_reference(klass)  # type: ignore[no-untyped-call]
        return not by_reference
    except (ImportError, AttributeError):  # private API moved: fall back to the common case
        return klass.__module__ == "__main__"


def _reachable_types(tp: Any, seen: set[int]) -> list[type[Any]]:
    """``tp`` and every class reachable through its type arguments and record fields."""
    if id(tp) in seen:
        return []
    seen.add(id(tp))
    found: list[type[Any]] = []
    for arg in get_args(tp):
        found += _reachable_types(arg, seen)
    if isinstance(tp, type) and tp.__module__ != "builtins":
        found.append(tp)
        if is_record_type(tp):
            for f in record_fields(tp):
                found += _reachable_types(f.type, seen)
    return found


def _prepare(tp: Any, seen: set[int]) -> None:
    for klass in _reachable_types(tp, seen):
        for base in klass.__mro__:
            if "__msgspec_cache__" in base.__dict__:
                with contextlib.suppress(AttributeError, TypeError):
                    delattr(base, "__msgspec_cache__")


def record_fields(tp: type[Any]) -> list[FieldSpec]:
    """The fields of a record type in declaration order."""
    hints = _type_hints(tp)
    if dataclasses.is_dataclass(tp):
        return [
            FieldSpec(
                name=f.name,
                type=hints.get(f.name, f.type),
                has_default=f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING,
                stored_name=f.name,
                init=f.init,
            )
            for f in dataclasses.fields(tp)
        ]
    if issubclass(tp, msgspec.Struct):
        return [
            FieldSpec(
                name=f.name,
                type=hints.get(f.name, f.type),
                has_default=f.default is not msgspec.NODEFAULT
                or f.default_factory is not msgspec.NODEFAULT,
                stored_name=f.encode_name,
            )
            for f in msgspec.structs.fields(tp)
        ]
    if _is_namedtuple(tp):
        defaults = getattr(tp, "_field_defaults", {})
        return [
            FieldSpec(name=n, type=hints[n], has_default=n in defaults, stored_name=n)
            for n in tp._fields
        ]
    if is_pydantic_model(tp):
        model_fields: dict[str, Any] = tp.model_fields
        return [
            FieldSpec(
                name=n,
                type=hints.get(n, info.annotation),
                has_default=not info.is_required(),
                stored_name=n,
            )
            for n, info in model_fields.items()
        ]
    raise ConfigError(
        f"{type_name(tp)} is not a record type; use a dataclass, msgspec.Struct, "
        "NamedTuple or pydantic model"
    )


def type_name(tp: Any) -> str:
    """A short, stable spelling of a type annotation (``list[int]``, ``str | None``, ``Row``)."""
    if tp is type(None):
        return "None"
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        return f"Annotated[{type_name(base)}, {', '.join(_meta_name(m) for m in meta)}]"
    if origin is Union or origin is types.UnionType:
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in get_args(tp))}]"
    if origin is not None:
        args = get_args(tp)
        name = getattr(origin, "__name__", str(origin))
        if not args:
            return str(name)
        return f"{name}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    if isinstance(tp, type):
        return tp.__qualname__
    return str(tp).replace("typing.", "")


def _meta_name(meta: Any) -> str:
    if isinstance(meta, Precision):
        return f"Precision({meta.precision}, {meta.scale})"
    return str(meta)


# ---------------------------------------------------------------------------------------------
# Type -> Arrow mapping, with value converters compiled per type


@dataclass(slots=True)
class _Node:
    """How one Python type maps to Arrow.

    ``enc`` turns a non-None Python value into what ``pa.array`` accepts (``None``: as is);
    ``dec`` turns a non-None value from ``to_pylist`` back (``None``: as is).
    """

    type: pa.DataType
    nullable: bool
    enc: _Conv | None
    dec: _Conv | None
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

    def node(self, tp: Any, path: str) -> _Node:
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
                return _Node(inner.type, True, None, _none_passing(dec), inner.fit)
            return _Node(inner.type, True, _none_passing(enc), _none_passing(dec))
        if origin is Annotated:
            return self.annotated(tp, path)
        if origin is Literal:
            return self.literal(tp, path)
        if origin in (list, tuple, Sequence):
            return self.sequence(tp, path)
        if origin is dict:
            return self.mapping(tp, path)
        if tp in _PRIMITIVES:
            return _Node(_PRIMITIVES[tp], False, None, None, fit_for(tp, _PRIMITIVES[tp]))
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self.enum(tp, path)
        if is_record_type(tp):
            return self.record(tp, path)
        raise self.fail(path, tp)

    def annotated(self, tp: Any, path: str) -> _Node:
        base, *meta = get_args(tp)
        for m in meta:
            if isinstance(m, Precision):
                if base is not Decimal:
                    raise self.fail(path, tp, "Precision applies to Decimal fields only")
                if not 1 <= m.precision <= 38 or not 0 <= m.scale <= m.precision:
                    raise self.fail(path, tp, "need 1 <= precision <= 38, 0 <= scale <= precision")
                arrow = pa.decimal128(m.precision, m.scale)
                return _Node(arrow, False, None, None, fit_for(Decimal, arrow))
            if isinstance(m, pa.DataType):
                if base not in _PRIMITIVES:
                    raise self.fail(path, tp, "an Arrow type override needs a primitive field")
                return _Node(m, False, None, None, fit_for(base, m))
        return self.node(base, path)

    def literal(self, tp: Any, path: str) -> _Node:
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

        return _Node(arrow, False, check, None)

    def enum(self, tp: type[enum.Enum], path: str) -> _Node:
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

        return _Node(arrow, False, enc, dec)

    def sequence(self, tp: Any, path: str) -> _Node:
        origin = get_origin(tp)
        args = get_args(tp)
        if origin is tuple:
            if len(args) != 2 or args[1] is not Ellipsis:
                raise self.fail(path, tp, "use tuple[X, ...] or a dataclass")
            args = args[:1]
        if len(args) != 1:
            raise self.fail(path, tp, "give the element type, e.g. list[int]")
        item = self.node(args[0], f"{path}[]")
        item_enc = _checked(item, f"{self.root.__qualname__}.{path}[]")
        item_dec = item.dec
        arrow = pa.list_(pa.field("item", item.type, nullable=item.nullable))
        enc: _Conv
        if item.enc is None and item.fit is not None:
            enc = _list_fitting(item.fit, item.nullable, f"{self.root.__qualname__}.{path}[]")
        elif item.enc is None and item.nullable:
            enc = _list_of(_identity)
        elif item.enc is None:
            enc = _list_without_none(f"{self.root.__qualname__}.{path}[]")
        else:
            enc = _list_of(item_enc)
        dec: _Conv | None
        if origin is tuple:
            dec = tuple if item_dec is None else _tuple_of(item_dec)
        else:
            dec = None if item_dec is None else _list_of(_none_passing(item_dec))
        return _Node(arrow, False, enc, dec)

    def mapping(self, tp: Any, path: str) -> _Node:
        args = get_args(tp)
        if len(args) != 2 or args[0] not in (str, int):
            raise self.fail(path, tp, "map keys must be str or int, e.g. dict[str, int]")
        key_type = _PRIMITIVES[args[0]]
        value = self.node(args[1], f"{path}{{}}")
        value_enc = _checked(value, f"{self.root.__qualname__}.{path}{{}}")
        value_dec = _none_passing(value.dec)
        arrow = pa.map_(key_type, pa.field("value", value.type, nullable=value.nullable))

        def enc(v: Any) -> Any:
            return [(k, value_enc(x)) for k, x in v.items()]

        def dec(v: Any) -> Any:
            return {k: value_dec(x) for k, x in v}

        return _Node(arrow, False, enc, dec)

    def record(self, tp: type[Any], path: str) -> _Node:
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
                _checked(n, f"{self.root.__qualname__}.{path}.{f.name}"),
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

        build = _constructor(tp, [(f, _none_passing(n.dec)) for f, n in children])
        return _Node(arrow, False, enc, build)


def _none_passing(conv: _Conv | None) -> _Conv:
    if conv is None:
        return _identity

    def f(v: Any) -> Any:
        return None if v is None else conv(v)

    return f


def _identity(v: Any) -> Any:
    return v


def _fitting(fit: Fit, path: str) -> _Conv:
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


def _list_fitting(fit: Fit, nullable: bool, path: str) -> _Conv:
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
                    raise _NullValue(path)
                continue
            item(x)
        return v

    return f


def _checked(node: _Node, path: str) -> _Conv:
    """Converter for a nested value: applies ``enc`` and rejects None where not nullable."""
    conv = node.enc
    if conv is None and node.fit is not None:
        conv = _fitting(node.fit, path)
    if node.nullable:
        return _none_passing(conv)

    def f(v: Any) -> Any:
        if v is None:
            raise _NullValue(path)
        return v if conv is None else conv(v)

    return f


def _list_of(conv: _Conv) -> _Conv:
    def f(v: Any) -> Any:
        if isinstance(v, str | bytes):
            raise TypeError(f"expected a list, got {type(v).__name__}")
        return [conv(x) for x in v]

    return f


def _list_without_none(path: str) -> _Conv:
    # Primitive items need no conversion; `None in v` runs in C, far faster than a loop.
    def f(v: Any) -> Any:
        if isinstance(v, str | bytes):
            raise TypeError(f"expected a list, got {type(v).__name__}")
        if None in v:
            raise _NullValue(path)
        return v

    return f


def _tuple_of(conv: _Conv) -> _Conv:
    def f(v: Any) -> Any:
        return tuple(None if x is None else conv(x) for x in v)

    return f


class _NullValue(Exception):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _constructor(tp: type[Any], fields: list[tuple[FieldSpec, _Conv]]) -> _Conv:
    """A function building ``tp`` from a dict of column values (for decoding)."""
    init = [(f.name, conv) for f, conv in fields if f.init]
    late = [(f.name, conv) for f, conv in fields if not f.init]

    def build(d: dict[str, Any]) -> Any:
        obj = tp(**{name: conv(d[name]) for name, conv in init})
        for name, conv in late:
            object.__setattr__(obj, name, conv(d[name]))
        return obj

    return build


def _root_nodes(tp: type[Any]) -> list[tuple[FieldSpec, _Node]]:
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
    return pa.schema([pa.field(f.name, n.type, nullable=n.nullable) for f, n in _root_nodes(tp)])


def _check_reserved(tp: type[Any], schema: pa.Schema) -> None:
    clash = [n for n in schema.names if n in RESERVED_COLUMNS]
    if clash:
        raise ConfigError(
            f"{tp.__qualname__}: field {clash[0]!r} clashes with a column inorder adds to every "
            f"output row ({', '.join(RESERVED_COLUMNS)}); rename it"
        )


def _full_schema(row_schema: pa.Schema) -> pa.Schema:
    return pa.schema([*ORIGIN_FIELDS, *row_schema, BATCH_ID_FIELD])


def output_schema(tp: type[Any]) -> pa.Schema:
    """Full output schema: ``ORIGIN_FIELDS`` + the row type's fields + ``BATCH_ID_FIELD``."""
    schema = arrow_schema(tp)
    _check_reserved(tp, schema)
    return _full_schema(schema)


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


# ---------------------------------------------------------------------------------------------
# Encoding and decoding rows


class RowEncoder(Generic[T]):
    """Encodes rows of one output type into Arrow record batches, column-wise.

    The type is analysed once at construction (raising ``ConfigError`` for unmappable fields
    or fields named like the engine's own columns); encoding then reads one attribute per
    field across all rows and lets pyarrow build each column.
    """

    def __init__(self, tp: type[T]) -> None:
        nodes = _root_nodes(tp)
        self._tp = tp
        self._schema = pa.schema([pa.field(f.name, n.type, nullable=n.nullable) for f, n in nodes])
        _check_reserved(tp, self._schema)
        self._output_schema = _full_schema(self._schema)
        self._columns = [
            (f.name, operator.attrgetter(f.name), n.enc, n.type, n.nullable) for f, n in nodes
        ]
        self._fits = {f.name: n.fit for f, n in nodes}
        owner = tp.__qualname__
        # Per row: primitive columns by kind (and range), the others through their converter.
        self._checks = [
            (
                f"{owner}.{f.name}",
                operator.attrgetter(f.name),
                n.fit.kinds if n.fit is not None else frozenset(),
                n.fit.bounds if n.fit is not None else None,
                n.fit,
                None if n.fit is not None else _checked(n, f"{owner}.{f.name}"),
                n.nullable,
            )
            for f, n in nodes
        ]
        self._all_fit = _compile_fit_check(tp, nodes)

    def __reduce__(self) -> tuple[Any, ...]:
        # Ship only the type; the converters are rebuilt where the encoder is unpickled.
        prepare_for_pickling(self._tp)
        return (RowEncoder, (self._tp,))

    @property
    def row_type(self) -> type[T]:
        """The row type this encoder was built for."""
        return self._tp

    @property
    def schema(self) -> pa.Schema:
        """The row type's own schema (no origin/batch columns)."""
        return self._schema

    @property
    def output_schema(self) -> pa.Schema:
        """``ORIGIN_FIELDS`` + :attr:`schema` + ``BATCH_ID_FIELD``."""
        return self._output_schema

    def row_problem(self, rows: Sequence[Any]) -> str | None:
        """Why a row does not fit the output schema exactly, or ``None`` when all do.

        The engine calls it on the rows of every ``process`` call, so a bad value is a
        ``row_schema`` violation of that record (handled by the integrity policy) rather than a
        value pyarrow would coerce or a failure of the whole batch later.
        """
        if self._all_fit(rows):
            return None
        return self._explain(rows)

    def _explain(self, rows: Sequence[Any]) -> str | None:
        for i, row in enumerate(rows):
            if type(row) is not self._tp and not isinstance(row, self._tp):
                return f"row {i} is a {type(row).__name__}, not a {self._tp.__qualname__}"
            for path, get, kinds, bounds, fit, conv, nullable in self._checks:
                value = get(row)
                if type(value) in kinds and (bounds is None or bounds[0] <= value <= bounds[1]):
                    continue
                if value is None:
                    if nullable:
                        continue
                    return f"{path}: None in a non-nullable field (declare it 'X | None')"
                if fit is not None:
                    problem = fit.problem(value)
                    if problem is not None:
                        return f"{path}: {problem}"
                    continue
                try:
                    if conv is not None:
                        conv(value)
                except _NullValue as exc:
                    return f"{exc.path}: None in a non-nullable field (declare it 'X | None')"
                except (TypeError, ValueError, AttributeError) as exc:
                    text = str(exc)
                    return text if text.startswith(path) else f"{path}: {text}"
        return None

    def encode_columns(self, rows: Sequence[T]) -> dict[str, pa.Array]:
        """One validated Arrow array per field of the row type, in schema order.

        Raises :class:`RowError` naming the field (and row, when known) of a value that does
        not fit, e.g. ``None`` in a field not declared ``X | None``.
        """
        owner = self._tp.__qualname__
        out: dict[str, pa.Array] = {}
        for name, get, enc, arrow, nullable in self._columns:
            values = list(map(get, rows))
            fit = self._fits[name]
            if fit is not None and not set(map(type, values)) <= fit.kinds | _NONE:
                for index, v in enumerate(values):
                    problem = None if v is None else fit.problem(v)
                    if problem is not None:
                        raise RowError(f"{owner}.{name}: {problem} (row {index})", name, index)
            if enc is not None:
                try:
                    values = [None if v is None else enc(v) for v in values]
                except _NullValue as exc:
                    row = _first_row(rows, get, enc)
                    raise RowError(
                        f"{exc.path}: None in a non-nullable field (row {row}); "
                        "declare it 'X | None' if it may be missing",
                        exc.path,
                        row,
                    ) from None
                except (TypeError, ValueError, AttributeError) as exc:
                    row = _first_row(rows, get, enc)
                    raise RowError(f"{owner}.{name}: {exc} (row {row})", name, row) from None
            try:
                array = pa.array(values, type=arrow)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
                for index, v in enumerate(values if fit is not None else ()):
                    problem = None if v is None or fit is None else fit.problem(v)
                    if problem is not None:  # e.g. an int beyond the column's width
                        raise RowError(
                            f"{owner}.{name}: {problem} (row {index})", name, index
                        ) from None
                row = _first_unfit(values, arrow)
                raise RowError(
                    f"{owner}.{name}: value does not fit {arrow} (row {row}): {exc}", name, row
                ) from None
            if not nullable and array.null_count:
                row = values.index(None)
                raise RowError(
                    f"{owner}.{name}: None in a non-nullable field (row {row}); "
                    "declare it 'X | None' if it may be missing",
                    f"{owner}.{name}",
                    row,
                )
            out[name] = array
        return out

    def encode(self, rows: Sequence[T]) -> pa.RecordBatch:
        """Rows as a record batch with :attr:`schema`."""
        columns = self.encode_columns(rows)
        return pa.RecordBatch.from_arrays(list(columns.values()), schema=self._schema)

    def encode_with_origin(
        self,
        rows: Sequence[T],
        topic: str,
        partition: int,
        offsets: Sequence[int],
        batch_id: int,
    ) -> pa.RecordBatch:
        """Rows as a record batch with :attr:`output_schema`.

        ``offsets`` holds the Kafka offset of the record that produced each row (one per row);
        ``topic``, ``partition`` and ``batch_id`` are the same for all rows.
        """
        n = len(rows)
        if len(offsets) != n:
            raise ValueError(f"encode_with_origin: {n} rows but {len(offsets)} offsets")
        columns = self.encode_columns(rows)
        arrays = [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(offsets, type=pa.int64()),
            *columns.values(),
            pa.repeat(pa.scalar(batch_id, pa.int64()), n),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self._output_schema)


def _first_row(rows: Sequence[Any], get: _Conv, enc: _Conv) -> int | None:
    """Index of the first row whose value ``enc`` rejects (only run once encoding failed)."""
    for i, row in enumerate(rows):
        v = get(row)
        if v is None:
            continue
        try:
            enc(v)
        except Exception:
            return i
    return None


def _first_unfit(values: list[Any], arrow: pa.DataType) -> int | None:
    """Index of the first value pyarrow cannot convert (only run once a column failed)."""
    for i, v in enumerate(values):
        try:
            pa.array([v], type=arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return i
    return None


def _compile_fit_check(
    tp: type[Any], nodes: list[tuple[FieldSpec, _Node]]
) -> Callable[[Sequence[Any]], bool]:
    """A function telling, fast, whether every row fits exactly (details: ``_explain``).

    Generated code, because this runs for every row the engine emits: straight-line exact
    type tests per field cost a fraction of a generic loop over field descriptors.
    """
    env: dict[str, Any] = {"T": tp}
    lines = ["def all_fit(rows):", "    for row in rows:", "        if type(row) is not T:"]
    lines.append("            return False")
    for i, (f, n) in enumerate(nodes):
        lines.append(f"        v = row.{f.name}")
        none_ok = "v is not None and " if n.nullable else ""
        if n.fit is not None:
            kinds = sorted(n.fit.kinds, key=lambda k: k.__name__)
            test = " and ".join(f"type(v) is not K{i}_{j}" for j in range(len(kinds)))
            for j, kind in enumerate(kinds):
                env[f"K{i}_{j}"] = kind
            if n.fit.bounds is not None:
                low, high = n.fit.bounds
                test = f"({test} or not ({low} <= v <= {high}))"
            lines += [f"        if {none_ok}{test}:", "            return False"]
        else:
            env[f"C{i}"] = _checked(n, f.name)
            lines += ["        try:", f"            C{i}(v)", "        except Exception:"]
            lines.append("            return False")
    lines.append("    return True")
    exec("\n".join(lines), env)  # built only from the row type's own field names and types
    check: Callable[[Sequence[Any]], bool] = env["all_fit"]
    return check


@functools.lru_cache(maxsize=64)
def row_encoder(tp: type[Any]) -> RowEncoder[Any]:
    """The (shared) encoder of a row type: its analysis is done once per process."""
    return RowEncoder(tp)


def decode_rows(batch: pa.RecordBatch | pa.Table, tp: type[T]) -> list[T]:
    """The rows of ``tp`` in a batch (inverse of :meth:`RowEncoder.encode`).

    Columns not in ``tp`` (e.g. ``topic`` or ``batch_id``) are ignored. Timestamps come back
    as UTC-aware datetimes.
    """
    nodes = _root_nodes(tp)
    missing = [f.name for f, _ in nodes if f.name not in batch.schema.names]
    if missing:
        raise ValueError(f"decode_rows: batch has no column {missing[0]!r} for {type_name(tp)}")
    columns: list[list[Any]] = []
    for f, n in nodes:
        values = batch.column(f.name).to_pylist()
        if n.dec is not None:
            dec = n.dec
            values = [None if v is None else dec(v) for v in values]
        columns.append(values)
    names = [f.name for f, _ in nodes]
    if all(f.init for f, _ in nodes):
        return [tp(**dict(zip(names, vals, strict=True))) for vals in zip(*columns, strict=True)]
    build = _constructor(tp, [(f, _identity) for f, _ in nodes])
    return [build(dict(zip(names, vals, strict=True))) for vals in zip(*columns, strict=True)]
