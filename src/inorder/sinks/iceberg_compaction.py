"""Merging an Iceberg table's small data files into larger ones in one snapshot.

``inorder compact --format iceberg`` (:func:`compact_iceberg`):

1. plan from the current snapshot: per partition, data files smaller than 3/4 of the
   target are packed (in path order, which is batch order: ``part-<batch>-...``) into
   groups of about ``target_file_size``; a group of one file is left alone;
2. each group is read with the table's current schema (a column added later reads as null)
   and written as one Parquet file beside its inputs (``compacted-<uuid>-<n>.parquet``);
   Iceberg readers read only the files a snapshot names, so nothing is visible yet;
3. one catalog commit (an ``overwrite`` snapshot: pyiceberg cannot write Iceberg's
   ``replace`` operation) removes the group's files and adds the merged ones. Its summary
   says ``inorder.operation = "compact"`` and has no batch id, so it never counts as a
   committed batch, and the batch summaries before it stay the exactly-once record.

The commit is not retried: if another writer committed meanwhile the merged files are
deleted and the command fails (run it again); the replaced files stay on storage until
snapshot expiry removes them, so readers of older snapshots keep working. Tables with
delete files (merge-on-read) or an evolved partition spec are refused: the engines' own
procedures (Spark ``CALL system.rewrite_data_files``) handle those.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from inorder.sinks.base import SinkError
from inorder.sinks.delta import delta_schema
from inorder.sinks.iceberg_history import COMPACT, OPERATION_KEY
from inorder.storage import fs as sfs

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

    from inorder.sinks.iceberg import IcebergSink

#: Where to go for what this module refuses.
ENGINE_PROCEDURE = (
    "use the engine's rewrite_data_files procedure (Spark: CALL system.rewrite_data_files)"
)


@dataclass
class IcebergCompactionReport:
    """What a compaction of an Iceberg table did (or would do, with ``dry_run``)."""

    table: str
    files_before: int = 0
    groups: int = 0
    files_replaced: int = 0
    files_written: int = 0
    rows: int = 0
    snapshot_id: int | None = None
    dry_run: bool = False

    def summary(self) -> str:
        """One line for humans."""
        verb = "would merge" if self.dry_run else "merged"
        done = "" if self.snapshot_id is None else f" in snapshot {self.snapshot_id}"
        return (
            f"{verb} {self.files_replaced} of {self.files_before} files ({self.rows:,} rows) "
            f"into {self.groups} files{done}"
        )


def plan_iceberg_groups(files: Sequence[DataFile], target_file_size: int) -> list[list[DataFile]]:
    """Small files packed per partition into groups of about ``target_file_size``."""
    small = sorted(
        (f for f in files if f.file_size_in_bytes < target_file_size * 3 // 4),
        key=lambda f: f.file_path,
    )
    by_partition: dict[str, list[DataFile]] = {}
    for f in small:
        by_partition.setdefault(repr(f.partition), []).append(f)
    groups: list[list[DataFile]] = []
    for members in by_partition.values():
        group: list[DataFile] = []
        size = 0
        for f in members:
            if group and size + f.file_size_in_bytes > target_file_size:
                groups.append(group)
                group, size = [], 0
            group.append(f)
            size += f.file_size_in_bytes
        groups.append(group)
    return [g for g in groups if len(g) > 1]


def compact_iceberg(
    sink: IcebergSink, target_file_size: int, dry_run: bool = False
) -> IcebergCompactionReport:
    """Merge the table's small files in one snapshot (see the module docstring)."""
    if target_file_size <= 0:
        raise SinkError("target_file_size must be > 0")
    report = IcebergCompactionReport(sink.table, dry_run=dry_run)
    table = sink.load_table()
    if table is None or table.current_snapshot() is None:
        return report
    tasks = list(table.scan().plan_files())
    report.files_before = len(tasks)
    spec_id = table.spec().spec_id
    for task in tasks:
        if task.delete_files:
            raise SinkError(
                f"{sink.describe()}: has delete files (merge-on-read); {ENGINE_PROCEDURE}"
            )
        if task.file.spec_id != spec_id:
            raise SinkError(
                f"{sink.describe()}: holds files of an older partition spec; {ENGINE_PROCEDURE}"
            )
    groups = plan_iceberg_groups([t.file for t in tasks], target_file_size)
    report.groups = len(groups)
    report.files_replaced = sum(len(g) for g in groups)
    report.rows = sum(f.record_count for g in groups for f in g)
    if dry_run or not groups:
        return report
    written: list[str] = []
    try:
        added = [_merge(sink, table, group, n, written) for n, group in enumerate(groups)]
        report.snapshot_id = _commit(sink, table, groups, added)
    except _NotCommitted as exc:
        loc = sink.location
        for rel in written:
            sfs.delete_quietly(loc, loc.join(rel))
        raise exc.error from None
    # Any other failure leaves the merged files: if the commit's outcome is unknown they
    # may be in the table now, and an unreferenced file is harmless.
    report.files_written = len(added)
    return report


class _NotCommitted(Exception):
    """Nothing was committed: the merged files can be deleted."""

    def __init__(self, error: SinkError) -> None:
        super().__init__(str(error))
        self.error = error


def _relative(sink: IcebergSink, table: Table, path: str) -> str:
    root = table.location().rstrip("/") + "/"
    if not path.startswith(root):
        raise SinkError(f"{sink.describe()}: data file {path} is outside the table location")
    return path.removeprefix(root)


def _merge(
    sink: IcebergSink, table: Table, group: list[DataFile], n: int, written: list[str]
) -> DataFile:
    """Write ``group``'s rows as one file beside them; its Iceberg data file entry."""
    import pyarrow.dataset as pads
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    loc = sink.location
    rels = [_relative(sink, table, f.file_path) for f in group]
    current = table.schema().as_arrow()
    # The types the sink writes, without Iceberg's field-id metadata: files are resolved
    # through the table's name mapping, as the sink's own files are.
    schema = pa.schema([pa.field(f.name, f.type, f.nullable) for f in delta_schema(current)])
    data = pads.dataset(
        [loc.join(r) for r in rels], schema=current, filesystem=loc.filesystem, format="parquet"
    ).to_table()
    expected = sum(f.record_count for f in group)
    if data.num_rows != expected:
        raise _NotCommitted(
            SinkError(
                f"{sink.describe()}: files hold {data.num_rows} rows, the snapshot lists "
                f"{expected}; nothing changed"
            )
        )
    directory = rels[0].rpartition("/")[0]
    rel = f"{directory}/compacted-{uuid.uuid4().hex}-{n:05d}.parquet"
    written.append(rel)
    try:
        pq.write_table(
            data.cast(schema, safe=False),
            loc.join(rel),
            filesystem=loc.filesystem,
            compression=sink.compression,
        )
        return parquet_file_to_data_file(table.io, table.metadata, _full(table, rel))
    except Exception as exc:
        raise _NotCommitted(sink._error(f"cannot write {rel}", exc)) from None


def _full(table: Table, rel: str) -> str:
    return f"{table.location().rstrip('/')}/{rel}"


def _commit(
    sink: IcebergSink, table: Table, groups: list[list[DataFile]], added: list[DataFile]
) -> int | None:
    """The commit point: one overwrite snapshot swapping the groups for the merged files."""
    from pyiceberg.exceptions import CommitFailedException

    # pyiceberg would retry a lost race on top of the winner; a repair that won may have
    # deleted rows of these very files. Fail instead (see IcebergSink._commit_snapshot).
    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})
    summary: dict[str, Any] = {OPERATION_KEY: COMPACT}
    tx = table.transaction()
    if table.metadata.name_mapping() is None:
        # The merged files carry no field ids (pyiceberg refuses to register files that do):
        # readers resolve them by name, so a table without a name mapping gets one, in the
        # same commit (as pyiceberg's add_files does).
        from pyiceberg.table import TableProperties

        mapping = table.schema().name_mapping.model_dump_json()
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
    try:
        with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
            for group in groups:
                for f in group:
                    overwrite.delete_data_file(f)
            for f in added:
                overwrite.append_data_file(f)
        committed = tx.commit_transaction()
    except CommitFailedException:
        raise _NotCommitted(
            SinkError(
                f"{sink.describe()}: another writer committed during the compaction; nothing "
                "changed, run it again"
            )
        ) from None
    snap = committed.current_snapshot()
    return None if snap is None else snap.snapshot_id
