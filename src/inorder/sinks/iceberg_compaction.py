"""Merging an Iceberg table's small data files into larger ones in one snapshot.

``inorder compact --format iceberg`` (:func:`compact_iceberg`):

1. plan from the current snapshot by the level rule of the Parquet sink
   (:mod:`inorder.sinks.compaction_levels`): Iceberg data files carry no free-form tags,
   so a file's level is in its name (``compacted-l<level>-t<ms>-<uuid>.parquet``; any other
   name is level 0), and so is a merged file's commit time: that of its oldest input, in
   milliseconds, so that the age rule sees its rows' age (merged files named before it
   was, ``compacted-l<level>-<uuid>.parquet``, take the snapshot that added them, their
   merge's); a batch's file takes the snapshot that added it;
2. each merge is read with the table's current schema (a column added later reads as null)
   and written as Parquet files beside its inputs, split at ``target_file_size``; Iceberg
   readers read only the files a snapshot names, so nothing is visible yet;
3. one catalog commit (an ``overwrite`` snapshot: pyiceberg cannot write Iceberg's
   ``replace`` operation) removes the merges' files and adds the merged ones. Its summary
   says ``inorder.operation = "compact"`` and has no batch id, so it never counts as a
   committed batch, and the batch summaries before it stay the exactly-once record.

A merge's output may complete the next level: planning repeats, one snapshot per round,
until nothing is left (at most ``levels`` rounds).

When a batch committed meanwhile, the commit is tried again on the newer snapshot if every
input is still live (a rebase: appends do not touch the merge's files), a few times; if
another writer replaced an input, the merged files are deleted and the command fails (run it
again). The replaced files stay on storage until snapshot expiry removes them, so readers of
older snapshots keep working. Tables with
delete files (merge-on-read) or an evolved partition spec are refused: the engines' own
procedures (Spark ``CALL system.rewrite_data_files``) handle those.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from inorder.sinks.base import SinkError
from inorder.sinks.compaction import CompactionReport
from inorder.sinks.compaction_levels import (
    DEFAULT_FANOUT,
    DEFAULT_LEVELS,
    DEFAULT_MAX_MERGE_BYTES,
    LevelSettings,
    Merge,
    check_level_settings,
    check_max_merge_bytes,
    estimate_trigger,
    file_level,
    output_pieces,
    plan_levels,
)
from inorder.sinks.compaction_merge import RowPieces
from inorder.sinks.delta import delta_schema
from inorder.sinks.iceberg_history import COMPACT, OPERATION_KEY
from inorder.sinks.parquet_compactor import ParquetCompactor
from inorder.sinks.parquet_writer import ROW_GROUP_BUFFER_BYTES
from inorder.storage import fs as sfs

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table


class CompactedTable(Protocol):
    """What a compaction needs of an Iceberg sink (:class:`~inorder.sinks.iceberg.IcebergSink`)."""

    table: str
    compression: str

    @property
    def location(self) -> sfs.Location:
        """The table's root."""

    def load_table(self) -> Table | None:
        """The table as the catalog has it now."""

    def describe(self) -> str:
        """One line for humans."""

    def error(self, what: str, exc: BaseException) -> SinkError:
        """A one-line error naming the table."""


#: Snapshot commits tried on newer snapshots when batches land during a compaction's commit.
COMMIT_ATTEMPTS = 5
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
    """Merges (each writes one file, or several when its rows exceed the target size)."""
    files_replaced: int = 0
    files_written: int = 0
    rows: int = 0
    snapshot_id: int | None = None
    dry_run: bool = False

    def summary(self) -> str:
        """One line for humans."""
        verb = "would merge" if self.dry_run else "merged"
        done = "" if self.snapshot_id is None else f" in snapshot {self.snapshot_id}"
        into = "" if self.dry_run else f" into {self.files_written} files"
        return (
            f"{verb} {self.files_replaced} of {self.files_before} files ({self.rows:,} rows) "
            f"in {self.groups} merges{into}{done}"
        )


@dataclass(frozen=True)
class TieredFile:
    """A data file of the current snapshot, as the level planner sees it."""

    file: DataFile
    level: int
    size_bytes: int
    committed_at: float | None
    """When the snapshot that added it was committed (``None``: not found)."""


def tiered_files(table: Table, files: Sequence[DataFile]) -> list[TieredFile]:
    """``files`` with their level (from the name) and commit time (from the snapshots)."""
    added: dict[str, float] = {}
    try:
        entries = table.inspect.entries()
        times = {s.snapshot_id: s.timestamp_ms / 1000 for s in table.snapshots()}
        paths = entries.column("data_file").combine_chunks().field("file_path").to_pylist()
        for path, sid in zip(paths, entries.column("snapshot_id").to_pylist(), strict=True):
            if sid in times:
                added[path] = times[sid]
    except Exception:  # an inspection pyiceberg cannot do: files count as of unknown age
        added = {}
    return [
        TieredFile(
            f,
            file_level(f.file_path),
            f.file_size_in_bytes,
            _first_known(merged_at(f.file_path), added.get(f.file_path)),
        )
        for f in sorted(files, key=lambda f: f.file_path)  # part-<batch>-...: batch order
    ]


def _first_known(*times: float | None) -> float | None:
    return next((t for t in times if t is not None), None)


_MERGED_AT = re.compile(r"^compacted-l\d+-t(\d+)-")


def merged_at(path: str) -> float | None:
    """The commit time of a merged file's oldest input, from its name (``None`` for other
    files and for merged files named before it was)."""
    match = _MERGED_AT.match(path.rsplit("/", 1)[-1])
    return int(match.group(1)) / 1000 if match else None


def plan_iceberg_merges(
    files: Sequence[TieredFile], settings: LevelSettings, now: float, full: bool = False
) -> list[Merge[TieredFile]]:
    """The level rule per partition (``full``: every non-final file of a partition)."""
    by_partition: dict[str, list[TieredFile]] = {}
    for f in files:
        by_partition.setdefault(repr(f.file.partition), []).append(f)
    return plan_levels(by_partition, now, settings, full)


def compact_iceberg(
    sink: CompactedTable,
    target_file_size: int,
    dry_run: bool = False,
    fanout: int = DEFAULT_FANOUT,
    levels: int = DEFAULT_LEVELS,
    full: bool = False,
    now: float | None = None,
    max_merge_bytes: int = DEFAULT_MAX_MERGE_BYTES,
    before_commit: Callable[[], None] | None = None,
) -> IcebergCompactionReport:
    """Merge the table's small files by the level rule (see the module docstring), each
    merge reading at most ``max_merge_bytes``; ``full`` merges every non-final file of each
    partition in the first round."""
    if target_file_size <= 0:
        raise SinkError("target_file_size must be > 0")
    check_level_settings(fanout, levels)
    check_max_merge_bytes(max_merge_bytes, target_file_size)
    report = IcebergCompactionReport(sink.table, dry_run=dry_run)
    when = time.time() if now is None else now
    for round_ in range(levels + 1):
        table = sink.load_table()
        if table is None or table.current_snapshot() is None:
            return report
        tasks = list(table.scan().plan_files())
        if not round_:
            report.files_before = len(tasks)
        _check_plain(sink, table, tasks)
        files = tiered_files(table, [t.file for t in tasks])
        settings = LevelSettings(
            target_file_size, fanout, levels, estimate_trigger(files), max_merge_bytes
        )
        merges = plan_iceberg_merges(files, settings, when, full and not round_)
        report.groups += len(merges)
        report.files_replaced += sum(len(m.files) for m in merges)
        report.rows += sum(f.file.record_count for m in merges for f in m.files)
        if dry_run or not merges:
            return report
        written: list[str] = []
        try:
            added = [f for m in merges for f in _merge(sink, table, m, target_file_size, written)]
            groups = [[f.file for f in m.files] for m in merges]
            report.snapshot_id = _commit(sink, table, groups, added, before_commit)
        except _NotCommitted as exc:
            loc = sink.location
            for rel in written:
                sfs.delete_quietly(loc, loc.join(rel))
            raise exc.error from None
        # Any other failure leaves the merged files: if the commit's outcome is unknown they
        # may be in the table now, and an unreferenced file is harmless.
        report.files_written += len(added)
    return report


def _check_plain(sink: CompactedTable, table: Table, tasks: Sequence[Any]) -> None:
    """Refuse what the engines' own procedures handle: delete files, evolved specs."""
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


class _NotCommitted(Exception):
    """Nothing was committed: the merged files can be deleted."""

    def __init__(self, error: SinkError) -> None:
        super().__init__(str(error))
        self.error = error


def _relative(sink: CompactedTable, table: Table, path: str) -> str:
    root = table.location().rstrip("/") + "/"
    if not path.startswith(root):
        raise SinkError(f"{sink.describe()}: data file {path} is outside the table location")
    return path.removeprefix(root)


def _merge(
    sink: CompactedTable,
    table: Table,
    merge: Merge[TieredFile],
    target_file_size: int,
    written: list[str],
) -> list[DataFile]:
    """Write ``merge``'s rows beside its files, split at the target; their data file entries.

    The inputs are read one file at a time (a level's merge may be far larger than memory)
    and each output file holds at most a row group's worth of rows in memory.
    """
    import pyarrow.dataset as pads
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    loc = sink.location
    rels = [_relative(sink, table, f.file.file_path) for f in merge.files]
    current = table.schema().as_arrow()
    # The types the sink writes, without Iceberg's field-id metadata: files are resolved
    # through the table's name mapping, as the sink's own files are.
    schema = pa.schema([pa.field(f.name, f.type, f.nullable) for f in delta_schema(current)])
    directory = rels[0].rpartition("/")[0]
    total = sum(f.file.record_count for f in merge.files)
    step = max(1, math.ceil(total / output_pieces(merge.size_bytes, target_file_size)))
    out: list[DataFile] = []
    pieces = RowPieces(step, lambda rows: _write(sink, table, schema, directory, merge, rows))
    try:
        for f, rel in zip(merge.files, rels, strict=True):
            # Read with the table's current schema: a column added later reads as null.
            data = pads.dataset(
                [loc.join(rel)], schema=current, filesystem=loc.filesystem, format="parquet"
            ).to_table()
            if data.num_rows != f.file.record_count:
                raise _NotCommitted(
                    SinkError(
                        f"{sink.describe()}: {rel} holds {data.num_rows} rows, the snapshot "
                        f"lists {f.file.record_count}; nothing changed"
                    )
                )
            pieces.add(data.cast(schema, safe=False))
        pieces.close()
    finally:
        written.extend(pieces.written)
    for rel in pieces.written:
        out.append(parquet_file_to_data_file(table.io, table.metadata, _full(table, rel)))
    return out


def _write(
    sink: CompactedTable,
    table: Table,
    schema: pa.Schema,
    directory: str,
    merge: Merge[TieredFile],
    rows: list[pa.Table],
) -> str:
    """One merged file of ``rows``, written by row groups; its relative path."""
    loc = sink.location
    # The level and the oldest input's commit time are in the name: Iceberg data files
    # carry no free-form tags.
    at = "" if merge.committed_at is None else f"t{round(merge.committed_at * 1000)}-"
    rel = f"{directory}/compacted-l{merge.level}-{at}{uuid.uuid4().hex}.parquet"
    try:
        with pq.ParquetWriter(
            loc.join(rel), schema, filesystem=loc.filesystem, compression=sink.compression
        ) as writer:
            group: list[pa.Table] = []
            for part in rows:
                group.append(part)
                if sum(t.nbytes for t in group) >= ROW_GROUP_BUFFER_BYTES:
                    writer.write_table(pa.concat_tables(group))
                    group = []
            if group:
                writer.write_table(pa.concat_tables(group))
    except Exception as exc:
        sfs.delete_quietly(loc, loc.join(rel))
        raise _NotCommitted(sink.error(f"cannot write {rel}", exc)) from None
    return rel


def _full(table: Table, rel: str) -> str:
    return f"{table.location().rstrip('/')}/{rel}"


def _commit(
    sink: CompactedTable,
    table: Table,
    groups: list[list[DataFile]],
    added: list[DataFile],
    before_commit: Callable[[], None] | None,
) -> int | None:
    """The commit point: one overwrite snapshot swapping the groups for the merged files.

    A batch committed meanwhile makes the snapshot's commit fail (pyiceberg's retries are
    off: a repair that won may have replaced these very files). The merge then *rebases*:
    it reloads the table and, if every input is still live, commits the same merged files
    on the newer snapshot, up to :data:`COMMIT_ATTEMPTS` times; an input gone means another
    writer replaced it, and nothing changes.
    """
    from pyiceberg.exceptions import CommitFailedException

    for _ in range(COMMIT_ATTEMPTS):
        if before_commit is not None:
            before_commit()  # the writer's lease: a fenced driver commits no merge
        try:
            return _overwrite(table, groups, added)
        except CommitFailedException:
            fresh = sink.load_table()
            if fresh is None:
                break
            tasks = list(fresh.scan().plan_files())
            _check_plain(sink, fresh, tasks)
            live = {t.file.file_path: t.file for t in tasks}
            if any(f.file_path not in live for group in groups for f in group):
                break
            table = fresh
            groups = [[live[f.file_path] for f in group] for group in groups]
    raise _NotCommitted(
        SinkError(
            f"{sink.describe()}: another writer replaced files of the compaction, or commits "
            f"kept landing during it ({COMMIT_ATTEMPTS} tries); nothing changed, run it again"
        )
    )


def _overwrite(table: Table, groups: list[list[DataFile]], added: list[DataFile]) -> int | None:
    """One overwrite snapshot on ``table`` as loaded (its commit fails if it is stale)."""
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
    with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
        for group in groups:
            for f in group:
                overwrite.delete_data_file(f)
        for f in added:
            overwrite.append_data_file(f)
    committed = tx.commit_transaction()
    snap = committed.current_snapshot()
    return None if snap is None else snap.snapshot_id


@dataclass
class IcebergCompactor(ParquetCompactor):
    """The Iceberg sink's merges after its commits (``compact=True``): the Parquet sink's
    rounds in a driver thread, each round one :func:`compact_iceberg` over the whole table
    (its planning reads the current snapshot's file list) on a copy of the sink with its own
    catalog client."""

    sink: CompactedTable | None = field(default=None, repr=False)

    def _compact(self, dry_run: bool, partitions: Collection[str] | None) -> CompactionReport:
        assert self.sink is not None
        done = compact_iceberg(
            self.sink,
            self.target_file_size,
            dry_run=dry_run,
            fanout=self.fanout,
            levels=self.levels,
            now=self.clock(),
            max_merge_bytes=self.max_merge_bytes,
            before_commit=self.guard,
        )
        return CompactionReport(groups=[[] for _ in range(done.groups)], dry_run=dry_run)
