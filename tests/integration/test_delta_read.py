"""Delta tables read through pyarrow's own filesystem, on local disk and S3.

``DeltaTable.to_pyarrow_dataset()`` without a filesystem reads through deltalake's Python
filesystem; a process that exits right after a scan can then abort in Arrow's thread pool
("terminate called without an active exception", 1 run in ~100 of the documented DuckDB
query under load). Every dataset inorder hands out (``query_dataset``, the ops tools'
partition-pruned read, ``rebuild_tables``' Delta input) must read through a native pyarrow
filesystem, and must read the same rows as deltalake, escaped partition values included.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from inorder.sessions.tables_delta import query_dataset
from inorder.sinks.delta_read import partition_pruned_dataset
from inorder.storage import fs as sfs

#: Partition values that Delta writes escaped in paths (space, colon, percent, slash, non-ASCII).
VALUES = ["a b", "c:d", "e%f", "g/h", "\u00fc=x", "plain", None]


def native(filesystem: pafs.FileSystem) -> bool:
    """Whether ``filesystem`` reaches files without calling back into Python."""
    while isinstance(filesystem, pafs.SubTreeFileSystem):
        filesystem = filesystem.base_fs
    return isinstance(filesystem, pafs.LocalFileSystem | pafs.S3FileSystem)


@pytest.mark.parametrize("sink_location", ["local", "s3"], indirect=True)
def test_datasets_read_natively_and_match_deltalake(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    rows = pa.table({"k": VALUES, "v": list(range(len(VALUES))), "s": ["x"] * len(VALUES)})
    write_deltalake(path, rows, partition_by=["k"], storage_options=options)
    table = DeltaTable(path, storage_options=options)
    expected = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["v"])

    loc = sfs.resolve(path, options)
    for dataset in (query_dataset(path, options), partition_pruned_dataset(table, loc)):
        assert native(dataset.filesystem), dataset.filesystem
        got = (
            dataset.to_table()
            .select(["k", "v", "s"])
            .cast(pa.schema([("k", pa.string()), ("v", pa.int64()), ("s", pa.string())]))
        )
        assert sorted(got.to_pylist(), key=lambda r: r["v"]) == expected
