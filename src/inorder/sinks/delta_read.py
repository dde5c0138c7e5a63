"""A Delta table as a pyarrow dataset: read through pyarrow's own filesystem, pruned by partition.

``DeltaTable.to_pyarrow_dataset()`` without a filesystem reads through a Python filesystem
(deltalake's ``DeltaStorageHandler`` in a ``PyFileSystem``). Arrow's thread pool then holds
Python file objects, and one released on an Arrow thread while the interpreter is exiting
takes the GIL, which ends that thread inside a C++ destructor: the process aborts with
"terminate called without an active exception" after its work is done (seen in a documented
DuckDB query, about 1 run in 100 under load; the core's stack ends in ``~PyReadableFile``).
:func:`delta_dataset` hands deltalake pyarrow's native local or S3 filesystem instead, so no
Python object is ever released on an Arrow thread.

``DeltaTable.to_pyarrow_dataset()`` also turns each file's statistics into a guarantee, and a
column without bounds becomes ``column >= null``: a filter on it then skips every file.
Data files written before inorder wrote string bounds (unpartitioned tables, filtered on
``topic``) read as empty that way. Readers that must see every row (validate, replay,
repair, inspect, the status page) open tables through :func:`partition_pruned_dataset`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

if TYPE_CHECKING:
    from inorder.storage.fs import Location


def delta_dataset(table: Any, location: Location, schema: pa.Schema | None = None) -> ds.Dataset:
    """``table`` (a ``DeltaTable`` at ``location``) as a dataset over pyarrow's own filesystem."""
    filesystem = pafs.SubTreeFileSystem(location.root, location.filesystem)
    return table.to_pyarrow_dataset(schema=schema, filesystem=filesystem)


def partition_pruned_dataset(table: Any, location: Location) -> ds.Dataset:
    """``table``'s current files as a dataset; each file's guarantee is its partition values."""
    full = delta_dataset(table, location)
    actions = pa.table(table.get_add_actions(flatten=True))
    columns = [c for c in actions.column_names if c.startswith("partition.")]
    by_path: dict[str, ds.Expression] = {}
    for row in actions.select(["path", *columns]).to_pylist():
        expr: ds.Expression = ds.scalar(True)
        for column in columns:
            name, value = column.removeprefix("partition."), row[column]
            field = ds.field(name)
            if value is None:
                expr = expr & field.is_null()
            else:
                expr = expr & (field == pa.scalar(value).cast(full.schema.field(name).type))
        by_path[str(row["path"])] = expr
    fragments = []
    for fragment in full.get_fragments():
        expr = by_path.get(fragment.path)
        if expr is None:  # a path spelled otherwise: keep deltalake's own fragment
            fragments.append(fragment)
            continue
        fragments.append(
            full.format.make_fragment(fragment.path, full.filesystem, partition_expression=expr)
        )
    return ds.FileSystemDataset(fragments, full.schema, full.format, full.filesystem)
