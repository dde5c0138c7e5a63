"""What a state type looks like, and which changes of it old state survives.

A processor's state is one object per key: a mutable dataclass, a mutable ``msgspec.Struct``, a
pydantic model, or a ``dict[str, X]``. It is serialised with msgspec's MessagePack encoder, as a
map from field name to value, so state written by one version of a job can be read by the next
as long as the change is compatible:

* adding a field **with a default** is compatible: old state gets the default;
* removing a field is compatible: the stored value is ignored (and lost on the next write);
* widening a type is compatible: ``int -> float``, ``int -> Decimal``, ``X -> X | None``,
  ``Literal``/``Enum`` gaining values, ``list``/``set``/``tuple[X, ...]`` swapping kinds;
* anything else is not: adding a field without a default, changing a field's type otherwise,
  making an optional field required, removing a ``Literal``/``Enum`` value, changing the
  positional layout of a ``NamedTuple``/``array_like`` Struct nested in state.

:func:`fingerprint` describes a type as JSON (kept in the checkpoint);
:func:`check_compatible` compares a stored fingerprint with the current type before the first
micro-batch and raises :class:`~inorder.errors.ConfigError` saying exactly what changed.
Renaming the class is not a change: only the stored field names and types matter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, get_args, get_origin

import msgspec
import msgspec.inspect as mi

from inorder.errors import ConfigError
from inorder.schema import is_pydantic_model, record_fields, type_name

#: Version of the fingerprint layout; bump when it changes incompatibly.
FINGERPRINT_FORMAT = 1

_PRIMITIVE_NAMES: dict[type[mi.Type], str] = {
    mi.IntType: "int",
    mi.FloatType: "float",
    mi.StrType: "str",
    mi.BoolType: "bool",
    mi.BytesType: "bytes",
    mi.ByteArrayType: "bytes",
    mi.MemoryViewType: "bytes",
    mi.DateTimeType: "datetime",
    mi.DateType: "date",
    mi.TimeType: "time",
    mi.TimeDeltaType: "timedelta",
    mi.UUIDType: "uuid",
    mi.DecimalType: "Decimal",
    mi.NoneType: "None",
    mi.AnyType: "any",
}

_SEQUENCE_NAMES: dict[type[mi.Type], str] = {
    mi.ListType: "list",
    mi.SetType: "set",
    mi.FrozenSetType: "frozenset",
    mi.VarTupleType: "tuple",
}

# Old -> new primitive changes msgspec decodes without loss.
_WIDENINGS = {("int", "float"), ("int", "Decimal")}


def state_type_name(tp: Any) -> str:
    """The name a message uses for a state type."""
    return type_name(tp)


def validate_state_type(tp: Any) -> None:
    """Raise ``ConfigError`` unless ``tp`` can be used as a processor's state type.

    State is mutated in place by ``process`` and written back after the micro-batch, so it
    must be mutable: frozen dataclasses and Structs, ``NamedTuple`` and scalars are rejected.
    ``array_like`` Structs are rejected because their positional layout cannot evolve.
    """
    _describe_root(tp)


def _describe_root(tp: Any) -> dict[str, Any]:
    name = state_type_name(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        params = getattr(tp, "__dataclass_params__", None)
        if params is not None and params.frozen:
            raise ConfigError(
                f"state type {name}: a frozen dataclass cannot be state (state is mutated "
                "in place); drop frozen=True"
            )
    elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        config = tp.__struct_config__
        if config.frozen:
            raise ConfigError(
                f"state type {name}: a frozen Struct cannot be state (state is mutated "
                "in place); drop frozen=True"
            )
        if config.array_like:
            raise ConfigError(
                f"state type {name}: array_like Structs cannot be state (fields are stored by "
                "name so the type can evolve); drop array_like=True"
            )
    elif is_pydantic_model(tp):
        if getattr(tp, "model_config", {}).get("frozen"):
            raise ConfigError(
                f"state type {name}: a frozen pydantic model cannot be state (state is "
                "mutated in place)"
            )
        return _describe_pydantic(tp, name)
    elif get_origin(tp) is dict:
        args = get_args(tp)
        if len(args) != 2 or args[0] is not str:
            raise ConfigError(
                f"state type {name}: a dict state needs str keys, e.g. dict[str, int]"
            )
    else:
        raise ConfigError(
            f"state type {name}: state must be a mutable dataclass, msgspec.Struct, pydantic "
            "model or dict[str, X]"
        )
    try:
        info = mi.type_info(tp)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"state type {name}: cannot serialise it: {exc}") from None
    return _Describer(name).describe(info, "")


def _describe_pydantic(tp: Any, name: str) -> dict[str, Any]:
    # msgspec cannot see into pydantic models; describe their fields one by one.
    describer = _Describer(name)
    fields = []
    for f in record_fields(tp):
        if is_pydantic_model(f.type):
            desc = _describe_pydantic(f.type, name)
        else:
            try:
                info = mi.type_info(f.type)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"state type {name}: field '{f.name}': {exc}") from None
            desc = describer.describe(info, f.name)
        fields.append({"name": f.stored_name, "type": desc, "has_default": f.has_default})
    return {"t": "record", "name": tp.__qualname__, "positional": False, "fields": fields}


class _Describer:
    """Turns msgspec's type info into a JSON tree, rejecting what msgpack cannot carry."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.seen: set[Any] = set()

    def fail(self, path: str, what: str) -> ConfigError:
        where = f" field '{path}':" if path else ""
        return ConfigError(f"state type {self.root}:{where} cannot serialise {what}")

    def describe(self, info: mi.Type, path: str) -> dict[str, Any]:
        kind = type(info)
        if kind in _PRIMITIVE_NAMES:
            return {"t": _PRIMITIVE_NAMES[kind]}
        if kind in _SEQUENCE_NAMES:
            return {"t": _SEQUENCE_NAMES[kind], "of": self.describe(info.item_type, f"{path}[]")}  # type: ignore[attr-defined]
        if isinstance(info, mi.TupleType):
            return {
                "t": "fixed_tuple",
                "of": [self.describe(i, f"{path}[]") for i in info.item_types],
            }
        if isinstance(info, mi.DictType):
            return {
                "t": "dict",
                "key": self.describe(info.key_type, f"{path}{{}}"),
                "value": self.describe(info.value_type, f"{path}{{}}"),
            }
        if isinstance(info, mi.LiteralType):
            return {"t": "literal", "values": sorted(info.values, key=repr)}
        if isinstance(info, mi.EnumType):
            return {
                "t": "enum",
                "name": info.cls.__qualname__,
                "values": sorted((m.value for m in info.cls), key=repr),
            }
        if isinstance(info, mi.UnionType):
            return {"t": "union", "of": [self.describe(i, path) for i in info.types]}
        if isinstance(
            info, mi.StructType | mi.DataclassType | mi.NamedTupleType | mi.TypedDictType
        ):
            return self.record(info, path)
        if isinstance(info, mi.CustomType):
            cls = info.cls
            if cls is object:
                return {"t": "any"}
            hint = (
                " (nest pydantic models only inside a pydantic state)"
                if is_pydantic_model(cls)
                else ""
            )
            raise self.fail(path, f"type '{type_name(cls)}'{hint}")
        raise self.fail(path, f"type '{info!r}'")

    def record(self, info: Any, path: str) -> dict[str, Any]:
        cls = info.cls
        if cls in self.seen:
            return {"t": "ref", "name": cls.__qualname__}
        self.seen.add(cls)
        try:
            positional = isinstance(info, mi.NamedTupleType) or bool(
                getattr(info, "array_like", False)
            )
            fields = [
                {
                    "name": f.encode_name,
                    "type": self.describe(f.type, f"{path}.{f.name}" if path else f.name),
                    "has_default": not f.required,
                }
                for f in info.fields
            ]
        finally:
            self.seen.discard(cls)
        out: dict[str, Any] = {
            "t": "record",
            "name": cls.__qualname__,
            "positional": positional,
            "fields": fields,
        }
        if getattr(info, "forbid_unknown_fields", False):
            out["forbid_unknown_fields"] = True
        tag = getattr(info, "tag", None)
        if tag is not None:
            out["tag"] = [getattr(info, "tag_field", None), tag]
        return out


def type_string(desc: dict[str, Any]) -> str:
    """A readable spelling of a type descriptor (``list[int]``, ``str | None``, ``Inner``)."""
    t = desc["t"]
    if t in ("list", "set", "frozenset"):
        return f"{t}[{type_string(desc['of'])}]"
    if t == "tuple":
        return f"tuple[{type_string(desc['of'])}, ...]"
    if t == "fixed_tuple":
        return f"tuple[{', '.join(type_string(d) for d in desc['of'])}]"
    if t == "dict":
        return f"dict[{type_string(desc['key'])}, {type_string(desc['value'])}]"
    if t == "literal":
        return f"Literal[{', '.join(repr(v) for v in desc['values'])}]"
    if t == "union":
        return " | ".join(type_string(d) for d in desc["of"])
    if t in ("enum", "record", "ref"):
        return str(desc["name"])
    return str(t)


def fingerprint(tp: Any) -> dict[str, Any]:
    """JSON-serialisable description of a state type (stored in checkpoints).

    ``fields`` lists ``{"name", "type", "has_default"}`` per top-level field (``type`` as a
    readable string); ``schema`` holds the full type tree used by :func:`check_compatible`.
    """
    desc = _describe_root(tp)
    fields = [
        {"name": f["name"], "type": type_string(f["type"]), "has_default": f["has_default"]}
        for f in desc.get("fields", ())
    ]
    return {
        "format": FINGERPRINT_FORMAT,
        "name": state_type_name(tp),
        "fields": fields,
        "schema": desc,
    }


class _Diff:
    """Collects incompatible changes and compatible notes while walking two descriptors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.notes: list[str] = []

    def changed(self, path: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        what = f"field '{path}'" if path else "the type"
        self.errors.append(f"{what} changed type {type_string(old)} -> {type_string(new)}")

    def compare(self, old: dict[str, Any], new: dict[str, Any], path: str) -> None:
        """Record whether a value stored as ``old`` can be read as ``new``."""
        if old == new or new["t"] == "any":
            return
        ot, nt = old["t"], new["t"]
        if nt == "union":
            olds = old["of"] if ot == "union" else [old]
            for member in olds:
                if not any(self.fits(member, n, path) for n in new["of"]):
                    self.changed(path, old, new)
                    return
            if ot != "union":
                self.notes.append(f"field '{path}' became {type_string(new)}")
            return
        if ot == "union":
            self.changed(path, old, new)
            return
        if not self.fits(old, new, path, record=True):
            self.changed(path, old, new)

    def fits(
        self, old: dict[str, Any], new: dict[str, Any], path: str, record: bool = False
    ) -> bool:
        """Whether ``old`` values decode as ``new``; records are diffed field by field."""
        if old == new or new["t"] == "any":
            return True
        ot, nt = old["t"], new["t"]
        if (ot, nt) in _WIDENINGS:
            self.notes.append(f"field '{path}' widened {ot} -> {nt}")
            return True
        seqs = ("list", "set", "frozenset", "tuple")
        if ot in seqs and nt in seqs:
            return self._quiet(old["of"], new["of"], f"{path}[]", record)
        if ot == nt == "dict":
            return self._quiet(old["key"], new["key"], f"{path}{{}}", record) and self._quiet(
                old["value"], new["value"], f"{path}{{}}", record
            )
        if ot in ("literal", "enum") and nt in ("literal", "enum"):
            return set(old["values"]) <= set(new["values"])
        if ot in ("literal", "enum"):
            kinds = {type(v).__name__ for v in old["values"]}
            return kinds == {nt} or (kinds == {"int"} and nt in ("float", "Decimal"))
        if ot == nt == "fixed_tuple":
            return len(old["of"]) == len(new["of"]) and all(
                self._quiet(o, n, f"{path}[]", record)
                for o, n in zip(old["of"], new["of"], strict=True)
            )
        if ot == nt == "ref":
            return bool(old["name"] == new["name"])
        if ot == nt == "record":
            if not record:
                probe = _Diff()
                probe.record(old, new, path)
                return not probe.errors
            self.record(old, new, path)
            return True
        return False

    def _quiet(self, old: dict[str, Any], new: dict[str, Any], path: str, record: bool) -> bool:
        if old["t"] == "record" and new["t"] == "record" and record:
            self.record(old, new, path)
            return True
        probe = _Diff()
        probe.compare(old, new, path)
        return not probe.errors

    def record(self, old: dict[str, Any], new: dict[str, Any], path: str) -> None:
        prefix = f"{path}." if path else ""
        if old.get("positional") or new.get("positional"):
            self.positional(old, new, prefix)
            return
        old_fields = {f["name"]: f for f in old["fields"]}
        new_fields = {f["name"]: f for f in new["fields"]}
        for name, nf in new_fields.items():
            of = old_fields.get(name)
            if of is None:
                if nf["has_default"]:
                    self.notes.append(f"field '{prefix}{name}' added (old state gets the default)")
                else:
                    self.errors.append(
                        f"field '{prefix}{name}' added without a default (old state has no "
                        "value for it); give it a default"
                    )
            else:
                self.compare(of["type"], nf["type"], f"{prefix}{name}")
        for name in old_fields:
            if name not in new_fields:
                if new.get("forbid_unknown_fields"):
                    self.errors.append(
                        f"field '{prefix}{name}' removed, but {new['name']} forbids unknown fields"
                    )
                else:
                    self.notes.append(f"field '{prefix}{name}' removed (stored values are dropped)")

    def positional(self, old: dict[str, Any], new: dict[str, Any], prefix: str) -> None:
        of, nf = old["fields"], new["fields"]
        if not (old.get("positional") and new.get("positional")):
            self.errors.append(
                f"'{prefix.rstrip('.') or old['name']}' changed between a NamedTuple/array_like "
                "layout and a by-name layout"
            )
            return
        for i, n in enumerate(nf):
            if i >= len(of):
                if not n["has_default"]:
                    self.errors.append(f"field '{prefix}{n['name']}' added without a default")
            elif of[i]["name"] != n["name"]:
                self.errors.append(
                    f"field '{prefix}{of[i]['name']}' at position {i} became '{n['name']}' "
                    "(positional layout: only appending fields with defaults is compatible)"
                )
            else:
                self.compare(of[i]["type"], n["type"], f"{prefix}{n['name']}")
        for f in of[len(nf) :]:
            self.errors.append(
                f"field '{prefix}{f['name']}' removed from a positional layout (NamedTuple or "
                "array_like Struct)"
            )


def _diff(old: dict[str, Any], new_tp: Any) -> tuple[str, _Diff]:
    if old.get("format") != FINGERPRINT_FORMAT:
        raise ConfigError(
            f"state type {state_type_name(new_tp)}: the checkpoint's state fingerprint has format "
            f"{old.get('format')!r}, this version reads format {FINGERPRINT_FORMAT}"
        )
    new = _describe_root(new_tp)
    diff = _Diff()
    if old["schema"]["t"] == new["t"] == "record":
        diff.record(old["schema"], new, "")
    else:
        diff.compare(old["schema"], new, "")
    return state_type_name(new_tp), diff


def check_compatible(old: dict[str, Any], new_tp: Any) -> None:
    """Raise ``ConfigError`` if state stored under fingerprint ``old`` cannot be read as ``new_tp``.

    The message lists every change, incompatible ones first, e.g. ``state type SiteStats:
    field 'total' changed type float -> str; field 'count' removed (stored values are
    dropped)``.
    """
    name, diff = _diff(old, new_tp)
    if diff.errors:
        raise ConfigError(f"state type {name}: {'; '.join(diff.errors + diff.notes)}")


def describe_changes(old: dict[str, Any], new_tp: Any) -> list[str]:
    """Every difference between ``old`` and ``new_tp`` (compatible ones too), for logs."""
    _, diff = _diff(old, new_tp)
    return diff.errors + diff.notes
