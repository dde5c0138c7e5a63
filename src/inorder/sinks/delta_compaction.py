"""Merging a Delta table's small files by the level rule, one Delta commit per round.

The Delta sink's ``compact`` option and ``inorder compact --format delta``:

1. plan from the newest table version by the level rule of the Parquet sink
   (:mod:`inorder.sinks.compaction_levels`): a file's level is in its name
   (``compacted-l<level>-<uuid>.parquet``; any other name is level 0) and its commit time is
   its ``add`` action's ``modificationTime`` (the batch's commit for a batch file; for a
   merged file, that of its oldest input, so the age rule sees its rows' age);
2. each merge is read one input file at a time and written as Parquet files beside its
   inputs, split at ``target_file_size``; Delta readers read only the files the log names, so
   nothing is visible yet;
3. one Delta commit removes the merges' files and adds the merged ones, both with
   ``dataChange = false`` (a stream reading the table sees no new rows). Its ``commitInfo``
   says ``inorder.operation = "compact"`` and records each merged file's rows and digest, so
   ``inorder verify`` checks merged files as it checks batch files; it has no batch id.

**Never merged twice.** delta-rs lets a commit remove a file that a concurrent commit already
removed, so two compactions of the same files would both add their merged rows. The commit
is therefore made without delta-rs's retries, on the version the inputs were checked live
in: when another commit (a batch) landed first, the inputs are checked again in the newer
version and the commit is tried on it, a few times; if an input is gone, the merged files are
deleted and nothing changes.

The removed files stay on storage until ``vacuum`` (``inorder compact --format delta``), so
readers of older versions keep working.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from inorder.sinks.base import SinkError
from inorder.sinks.commit_keys import COMPACT, FILES_KEY, OPERATION_KEY, proof_json
from inorder.sinks.compaction import CompactionReport
from inorder.sinks.compaction_levels import (
    LevelSettings,
    Merge,
    age_due,
    check_level_settings,
    check_max_merge_bytes,
    estimate_trigger,
    file_level,
    output_pieces,
    plan_levels,
)
from inorder.sinks.compaction_merge import RowPieces, file_dir
from inorder.sinks.delta_stats import merge_stats, stats_json
from inorder.sinks.parquet_compactor import ParquetCompactor
from inorder.sinks.parquet_writer import ROW_GROUP_BUFFER_BYTES
from inorder.sinks.proof import add_digests, format_digest, table_digest
from inorder.storage import fs as sfs

#: How often the sink's compactor vacuums the table (its first round vacuums too).
VACUUM_EVERY_SECONDS = 3600.0
#: Commits tried on newer versions when batches land during a round's commit.
COMMIT_ATTEMPTS = 5


@dataclass(frozen=True)
class DeltaFile:
    """A live data file of the table, as the level planner sees it."""

    path: str
    """Relative to the table's root, as the log names it."""
    size_bytes: int
    rows: int
    partition_values: dict[str, str | None]
    modified_ms: int

    @property
    def level(self) -> int:
        """0 for a batch's file, else the level in a merged file's name."""
        return file_level(self.path)

    @property
    def committed_at(self) -> float | None:
        """The ``add`` action's time: its batch's commit (a merge keeps its oldest input's)."""
        return self.modified_ms / 1000.0 if self.modified_ms > 0 else None


def live_files(table: Any) -> list[DeltaFile]:
    """The data files of ``table``'s version (a ``deltalake.DeltaTable``)."""
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    columns = [c for c in actions if c.startswith("partition.")]
    files = []
    for i, path in enumerate(actions["path"]):
        when = actions["modification_time"][i]
        ms = int(when.timestamp() * 1000) if hasattr(when, "timestamp") else int(when or 0)
        values = {c.removeprefix("partition."): _value(actions[c][i]) for c in columns}
        rows = actions["num_records"][i] if "num_records" in actions else None
        files.append(
            DeltaFile(str(path), int(actions["size_bytes"][i]), int(rows or 0), values, ms)
        )
    return files


def _value(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class DeltaTarget:
    """What a compaction needs of the table: where it is and how its files are written."""

    location: sfs.Location
    partition_by: Sequence[str]
    compression: str
    describe: str

    def table(self) -> Any:
        """The table at its newest version."""
        from deltalake import DeltaTable

        loc = self.location
        return DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())


def compact_delta_levels(
    target: DeltaTarget,
    settings: LevelSettings,
    dry_run: bool = False,
    full: bool = False,
    now: float | None = None,
    partitions: Collection[str] | None = None,
    before_commit: Callable[[], None] | None = None,
    max_round_merges: int | None = None,
) -> CompactionReport:
    """Merge what the level rule says is due (see the module docstring) in ``partitions``
    (directories; ``None``: all), at most ``max_round_merges`` merges in all.

    A merge's output may complete the next level, so planning repeats over the partitions
    that merged, one Delta commit per pass, until nothing is due (at most ``levels``
    passes). The report's ``left`` names the partitions whose due merges the bound left,
    ``due`` when each planned partition's next merge by age falls due.
    """
    check_level_settings(settings.fanout, settings.levels)
    check_max_merge_bytes(settings.max_merge_bytes, settings.target_file_size)
    report = CompactionReport(dry_run=dry_run)
    when = time.time() if now is None else now
    for pass_ in range(settings.levels):
        budget = None if max_round_merges is None else max_round_merges - len(report.groups)
        if budget is not None and budget <= 0:
            report.left = sorted(set(partitions or ()))
            break
        merged = _pass(
            target, settings, report, when, partitions, full and not pass_, budget, before_commit
        )
        if dry_run or not merged or report.left:
            break
        partitions = merged
    return report


def _pass(
    target: DeltaTarget,
    settings: LevelSettings,
    report: CompactionReport,
    when: float,
    partitions: Collection[str] | None,
    full: bool,
    budget: int | None,
    before_commit: Callable[[], None] | None,
) -> set[str]:
    """One planning and its commit; the partitions it merged in."""
    table = target.table()
    _check_plain(target, table)
    files = live_files(table)
    if not report.groups:
        report.files_before = report.files_after = len(files)
    by_partition: dict[str, list[DeltaFile]] = {}
    for f in files:
        directory = file_dir(f.path)
        if partitions is None or directory in partitions:
            by_partition.setdefault(directory, []).append(f)
    settings = LevelSettings(
        settings.target_file_size,
        settings.fanout,
        settings.levels,
        estimate_trigger(files),
        settings.max_merge_bytes,
    )
    merges = plan_levels(by_partition, when, settings, full)
    if budget is not None and len(merges) > budget:
        report.left = sorted({file_dir(m.files[0].path) for m in merges[budget:]})
        merges = merges[:budget]
    for directory, group in by_partition.items():
        due = age_due(group, settings)
        report.due.pop(directory, None)
        if due is not None:
            report.due[directory] = due
    report.groups += [[f.path for f in m.files] for m in merges]
    report.bytes_rewritten += sum(m.size_bytes for m in merges)
    if report.dry_run or not merges:
        return set()
    written: dict[str, tuple[int, str, str]] = {}
    try:
        added = [
            a for m in merges for a in _merge(target, table, m, settings.target_file_size, written)
        ]
        _commit(target, merges, added, written, before_commit)
    except _NotCommitted as exc:
        loc = target.location
        for rel in written:
            sfs.delete_quietly(loc, loc.join(rel))
        raise exc.error from None
    # Any other failure leaves the merged files: if the commit's outcome is unknown they may
    # be in the table now, and an unreferenced file is harmless (vacuum removes it).
    report.files_after += len(added) - sum(len(m.files) for m in merges)
    return {file_dir(m.files[0].path) for m in merges}


#: Table features whose files this merge cannot rewrite by reading them as plain Parquet.
UNMERGEABLE_FEATURES = frozenset({"deletionVectors", "columnMapping"})


def _check_plain(target: DeltaTarget, table: Any) -> None:
    """Refuse tables whose files carry deletion vectors or mapped column names: reading
    their Parquet alone would bring deleted rows back or miss renamed columns."""
    protocol = table.protocol()
    features = set(protocol.reader_features or ()) | set(protocol.writer_features or ())
    used = sorted(features & UNMERGEABLE_FEATURES)
    if used:
        raise SinkError(
            f"{target.describe}: the table uses {', '.join(used)}, which this compaction "
            "does not rewrite; compact it with the engine's OPTIMIZE (Spark: OPTIMIZE "
            "<table>) or delta-rs' optimize.compact"
        )


class _NotCommitted(Exception):
    """Nothing was committed: the merged files can be deleted."""

    def __init__(self, error: SinkError) -> None:
        super().__init__(str(error))
        self.error = error


def _merge(
    target: DeltaTarget,
    table: Any,
    merge: Merge[DeltaFile],
    target_file_size: int,
    written: dict[str, tuple[int, str, str]],
) -> list[Any]:
    """Write ``merge``'s rows beside its files, split at the target; their ``add`` actions.

    Inputs are read one at a time with the table's current schema (a column added later
    reads as null), without the partition columns, which Delta keeps in the log.
    """
    import pyarrow.dataset as pads
    from deltalake.transaction import AddAction

    loc = target.location
    current = pa.schema(table.schema().to_arrow())
    schema = pa.schema([f for f in current if f.name not in set(target.partition_by)])
    first = merge.files[0]
    directory = file_dir(first.path)
    total = sum(f.rows for f in merge.files)
    step = max(1, math.ceil(total / output_pieces(merge.size_bytes, target_file_size)))
    pieces = RowPieces(step, lambda rows: _write(target, schema, directory, merge, rows, written))
    for f in merge.files:
        data = pads.dataset(
            [loc.join(f.path)], schema=schema, filesystem=loc.filesystem, format="parquet"
        ).to_table()
        if f.rows and data.num_rows != f.rows:
            raise _NotCommitted(
                SinkError(
                    f"{target.describe}: {f.path} holds {data.num_rows} rows, the Delta log "
                    f"lists {f.rows}; nothing changed"
                )
            )
        pieces.add(data)
    pieces.close()
    oldest = min((f.modified_ms for f in merge.files if f.modified_ms > 0), default=0)
    actions = []
    for rel in pieces.written:
        stats = written[rel][2]
        size = loc.filesystem.get_file_info(loc.join(rel)).size
        actions.append(
            AddAction(
                path=rel,
                size=int(size or 0),
                partition_values=dict(first.partition_values),
                modification_time=oldest or int(time.time() * 1000),
                data_change=False,
                stats=stats,
            )
        )
    return actions


def _write(
    target: DeltaTarget,
    schema: pa.Schema,
    directory: str,
    merge: Merge[DeltaFile],
    rows: list[pa.Table],
    written: dict[str, tuple[int, str, str]],
) -> str:
    """One merged file of ``rows``, written by row groups; its relative path."""
    loc = target.location
    name = f"compacted-l{merge.level}-{uuid.uuid4().hex}.parquet"
    rel = f"{directory}/{name}" if directory else name
    digest, count = 0, 0
    stats: dict[str, list[Any]] = {}
    try:
        with pq.ParquetWriter(
            loc.join(rel), schema, filesystem=loc.filesystem, compression=target.compression
        ) as writer:
            group: list[pa.Table] = []
            for part in [*rows, None]:
                if part is not None:
                    group.append(part)
                full = sum(t.nbytes for t in group) >= ROW_GROUP_BUFFER_BYTES
                if group and (full or part is None):
                    data = pa.concat_tables(group).cast(schema)
                    writer.write_table(data)
                    digest = add_digests(digest, table_digest(data))
                    stats = merge_stats(stats, data)
                    count += data.num_rows
                    group = []
    except Exception as exc:
        sfs.delete_quietly(loc, loc.join(rel))
        secrets = (loc.s3.secret_access_key,) if loc.s3 else ()
        raise _NotCommitted(
            SinkError(f"{target.describe}: cannot write {rel}: {sfs.describe_error(exc, secrets)}")
        ) from None
    written[rel] = (count, format_digest(digest), stats_json(count, stats))
    return rel


def _commit(
    target: DeltaTarget,
    merges: Sequence[Merge[DeltaFile]],
    added: list[Any],
    written: dict[str, tuple[int, str, str]],
    before_commit: Callable[[], None] | None,
) -> None:
    """The commit point: one Delta commit swapping the merges' files for the merged ones, on
    a version in which every input is still live (see "Never merged twice" above)."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, RemoveAction

    inputs = [f for m in merges for f in m.files]
    metadata = {
        OPERATION_KEY: COMPACT,
        FILES_KEY: proof_json({rel: (rows, digest) for rel, (rows, digest, _) in written.items()}),
    }
    for _ in range(COMMIT_ATTEMPTS):
        table = target.table()
        live = {f.path for f in live_files(table)}
        gone = [f.path for f in inputs if f.path not in live]
        if gone:
            raise _NotCommitted(
                SinkError(
                    f"{target.describe}: {gone[0]} was removed by another commit during the "
                    "compaction (another compactor?); nothing changed"
                )
            )
        if before_commit is not None:
            before_commit()  # the writer's lease: a fenced driver commits no merge
        now = int(time.time() * 1000)
        removes = [
            RemoveAction(f.path, False, now, f.size_bytes, dict(f.partition_values)) for f in inputs
        ]
        try:
            table.create_write_transaction(
                [*removes, *added],
                mode="append",
                schema=table.schema(),
                partition_by=list(target.partition_by) or None,
                commit_properties=CommitProperties(custom_metadata=metadata, max_commit_retries=0),
            )
            return
        except CommitFailedError:
            continue  # a commit landed first: check the inputs again on the newer version
    raise _NotCommitted(
        SinkError(
            f"{target.describe}: other commits kept landing during the compaction's commit "
            f"({COMMIT_ATTEMPTS} tries); nothing changed, the next round tries again"
        )
    )


@dataclass
class DeltaCompactor(ParquetCompactor):
    """The Delta sink's merges after its commits: the Parquet sink's rounds (touched
    partitions, sweeps, bounds, the timer, in a driver thread or inline), each round one
    :func:`compact_delta_levels`.

    At most once per ``vacuum_every`` seconds a round also vacuums the table with its own
    retention (``delta.deletedFileRetentionDuration``, 7 days by default), so the files the
    merges replaced leave the disk in a stream that runs for weeks, as a Parquet output's
    leave after their grace period.
    """

    table: DeltaTarget | None = None
    vacuum_every: float = VACUUM_EVERY_SECONDS
    _vacuumed_at: float | None = None

    def _compact(self, dry_run: bool, partitions: Collection[str] | None) -> CompactionReport:
        assert self.table is not None
        settings = LevelSettings(
            self.target_file_size, self.fanout, self.levels, None, self.max_merge_bytes
        )
        if not dry_run:
            self._vacuum()
        return compact_delta_levels(
            self.table,
            settings,
            dry_run=dry_run,
            now=self.clock(),
            partitions=partitions,
            before_commit=self.guard,
            max_round_merges=None if dry_run else self.max_round_merges,
        )

    def _vacuum(self) -> None:
        now = self.clock()
        if self._vacuumed_at is not None and now - self._vacuumed_at < self.vacuum_every:
            return
        assert self.table is not None
        self._vacuumed_at = now
        # The table's own retention: readers of versions within it keep their files.
        self.table.table().vacuum(dry_run=False, enforce_retention_duration=True)


__all__ = [
    "DeltaCompactor",
    "DeltaFile",
    "DeltaTarget",
    "compact_delta_levels",
    "live_files",
]
