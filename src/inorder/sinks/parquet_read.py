"""Readers of a committed Parquet dataset: exactly the committed rows, never staged ones.

They read the files named by done manifests and commit checkpoints
(:mod:`inorder.sinks.commit_log`), never by listing data directories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from inorder.sinks.commit_log import (
    COMMITS_DIR,
    DatasetState,
    LiveFile,
    decode_schema,
    file_batch_id,
    is_not_found,
    list_commits,
    live_file,
    load_state,
    manifest_name,
    read_manifest,
)
from inorder.storage import fs as sfs

if TYPE_CHECKING:
    import pyarrow.dataset as ds


def committed_files(path: str, storage_options: Mapping[str, str] | None = None) -> list[LiveFile]:
    """The published files of committed batches (after compactions), in commit order."""
    location = sfs.resolve(path, storage_options)
    return list(load_state(location).files.values())


def read_committed(
    path: str, storage_options: Mapping[str, str] | None = None, retries: int = 5
) -> pa.Table:
    """Read exactly the committed data: a consistent snapshot, even during compaction.

    Reads the files named by done manifests, never by listing data directories, so staged,
    half-published or compacted-away files are never included. If compaction deleted a file
    between listing and reading (grace period shorter than the read), the read restarts.
    """
    location = sfs.resolve(path, storage_options)
    state = load_state(location)
    for attempt in range(retries + 1):
        try:
            return _read_files(location, state)
        except OSError:
            # A file vanished under us only if the committed file set changed meanwhile.
            fresh = load_state(location)
            if attempt == retries or set(fresh.files) == set(state.files):
                raise
            state = fresh
    raise AssertionError("unreachable")


def read_batch_range(
    location: sfs.Location, first: int, last: int, columns: Sequence[str] | None = None
) -> pa.Table:
    """Committed rows of a dataset with ``first <= batch_id <= last`` (see ``read_batches``).

    A short range is read from its batches' manifests alone (no listing of the whole commit
    log, which grows with every batch); if compaction replaced one of their files, from the
    dataset's full state.
    """
    if last - first < 16:
        table = _read_from_manifests(location, first, last)
        if table is not None:
            return _select_batches(table, first, last, columns)
    state = load_state(location)
    wanted = {}
    for path, live in state.files.items():
        bid = file_batch_id(path)
        if bid is None or first <= bid <= last:
            wanted[path] = live
    selected = DatasetState(
        wanted, state.batches, state.compactions, state.schema, state.partition_by, []
    )
    return _select_batches(_read_files(location, selected), first, last, columns)


def _select_batches(
    table: pa.Table, first: int, last: int, columns: Sequence[str] | None
) -> pa.Table:
    if table.num_columns == 0:
        return table
    batch_ids = table.column("batch_id")
    table = table.filter(
        pc.and_(pc.greater_equal(batch_ids, first), pc.less_equal(batch_ids, last))
    )
    return table.select(list(columns)) if columns is not None else table


def _read_from_manifests(location: sfs.Location, first: int, last: int) -> pa.Table | None:
    """Rows of batches ``first..last`` from their done manifests; ``None`` if that is not
    enough (a manifest not done or deleted after a checkpoint, no schema recorded, or a
    file compacted away)."""
    files: dict[str, LiveFile] = {}
    schema: pa.Schema | None = None
    partition_by: list[str] = []
    for bid in range(max(first, 0), last + 1):
        rel = f"{COMMITS_DIR}/{manifest_name(bid)}"
        if not sfs.exists(location, location.join(rel.removesuffix(".json") + ".done")):
            if sfs.exists(location, location.join(rel)):
                return None  # committed but not published yet: the full path finishes it
            # No such batch, or its manifest was deleted after a commit checkpoint.
            newest = list_commits(location).newest_checkpoint
            if newest is not None and bid <= newest:
                return None
            continue
        try:
            manifest = read_manifest(location, rel)
        except OSError as exc:
            if is_not_found(exc):
                return None  # deleted after a commit checkpoint meanwhile
            raise
        if not manifest.get("schema"):
            return None
        schema = decode_schema(manifest["schema"])
        partition_by = list(manifest.get("partition_by", []))
        for entry in manifest["files"]:
            files[entry["final"]] = live_file(entry, manifest.get("created_at"))
    if schema is None:
        return None
    state = DatasetState(files, [], [], schema, partition_by, [])
    try:
        return _read_files(location, state)
    except OSError:
        return None  # a file was compacted away: read from the full state


def committed_dataset(location: sfs.Location, state: DatasetState) -> ds.Dataset | None:
    """The committed files of ``state`` as one dataset (``None`` when there are none).

    Read with the newest schema: files written before a compatible evolution (columns added
    as nullable) read the new columns as null instead of deciding the schema themselves.
    """
    # Imported here: pyarrow.dataset imports pandas (about 0.2 s of CPU), which a command
    # that reads no dataset need not pay (most commands the CLI refuses exit before reading).
    import pyarrow.dataset as ds

    paths = [location.join(f.path) for f in state.files.values()]
    if not paths:
        return None
    schema = state.schema
    partition_by = state.partition_by
    if schema is not None:
        part_schema = pa.schema([schema.field(c) for c in partition_by])
    else:
        part_schema = pa.schema([pa.field(c, pa.string()) for c in partition_by])
    return ds.dataset(
        paths,
        schema=schema,
        filesystem=location.filesystem,
        format="parquet",
        partitioning=ds.partitioning(part_schema, flavor="hive") if partition_by else None,
        partition_base_dir=location.root,
    )


def _read_files(location: sfs.Location, state: DatasetState) -> pa.Table:
    dataset = committed_dataset(location, state)
    schema = state.schema
    if dataset is None:
        return schema.empty_table() if schema is not None else pa.table({})
    table = dataset.to_table()
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    return table
