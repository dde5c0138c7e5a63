"""Record types as inorder sees them: which classes are records, their fields, their names.

Dataclasses, ``msgspec.Struct``, ``typing.NamedTuple`` and pydantic models; forward
references resolved; classes defined in ``__main__`` or a notebook prepared for pickling to
executors (:func:`prepare_for_pickling`) or rejected when they cannot travel
(:func:`check_portable`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from inorder.errors import ConfigError

_NONE = frozenset({type(None)})


@dataclass(frozen=True, slots=True)
class Precision:
    """Decimal precision and scale: ``Annotated[Decimal, Precision(18, 2)]``."""

    precision: int
    scale: int


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
