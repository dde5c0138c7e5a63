"""Which changes of an output schema a dataset can take in place."""

from __future__ import annotations

import pyarrow as pa


def schema_change(old: pa.Schema, new: pa.Schema) -> tuple[bool, list[str]]:
    """Whether ``old -> new`` is a compatible evolution, and lines describing the change.

    Compatible: every old column is still there with the same type and no stricter
    nullability; new columns are nullable (old files read them as null).
    """
    lines: list[str] = []
    compatible = True
    for f in old:
        if f.name not in new.names:
            lines.append(f"column {f.name!r} ({f.type}) was removed")
            compatible = False
            continue
        g = new.field(f.name)
        if not g.type.equals(f.type):
            lines.append(f"column {f.name!r} changed type {f.type} -> {g.type}")
            compatible = False
        elif f.nullable and not g.nullable:
            lines.append(f"column {f.name!r} became not null")
            compatible = False
    for g in new:
        if g.name not in old.names:
            if g.nullable:
                lines.append(f"column {g.name!r} ({g.type}) added")
            else:
                lines.append(f"column {g.name!r} ({g.type}) added as not null")
                compatible = False
    return compatible, lines
