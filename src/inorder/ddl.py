"""Spark DDL strings from Arrow schemas, in pure Python.

Spark's own ``StructType.toDDL()`` needs a running JVM, so module-level constants (the
schemas of the rows inorder's tasks exchange with Spark) could not use it; this writes the
same DDL from the Arrow schema, which stays the one place each schema is declared. Field
nullability is not expressed (Spark DDL columns are nullable).
"""

from __future__ import annotations

import pyarrow as pa

_SIMPLE: tuple[tuple[pa.DataType, str], ...] = (
    (pa.string(), "string"),
    (pa.large_string(), "string"),
    (pa.binary(), "binary"),
    (pa.large_binary(), "binary"),
    (pa.bool_(), "boolean"),
    (pa.int8(), "tinyint"),
    (pa.int16(), "smallint"),
    (pa.int32(), "int"),
    (pa.int64(), "bigint"),
    (pa.float32(), "float"),
    (pa.float64(), "double"),
    (pa.date32(), "date"),
)


def arrow_ddl(schema: pa.Schema) -> str:
    """``name type, ...`` for ``DataFrame.mapInArrow``, ``DataSource.schema()`` and the like."""
    return ", ".join(f"{f.name} {ddl_type(f.type)}" for f in schema)


def ddl_type(arrow: pa.DataType) -> str:
    """The Spark DDL type of an Arrow type."""
    for simple, name in _SIMPLE:
        if arrow.equals(simple):
            return name
    if pa.types.is_timestamp(arrow):
        return "timestamp" if arrow.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return f"array<{ddl_type(arrow.value_type)}>"
    if pa.types.is_map(arrow):
        return f"map<{ddl_type(arrow.key_type)},{ddl_type(arrow.item_type)}>"
    if pa.types.is_struct(arrow):
        fields = ", ".join(f"{f.name}: {ddl_type(f.type)}" for f in arrow)
        return f"struct<{fields}>"
    raise TypeError(f"no Spark DDL type for Arrow type {arrow}")
