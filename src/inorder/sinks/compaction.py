"""Merging small output files while the pipeline runs, and removing obsolete ones safely.

Parquet datasets (the manifest protocol of :mod:`inorder.sinks.parquet`):

1. plan from the committed state by the level rule (:mod:`inorder.sinks.compaction_levels`):
   per partition directory, ``fanout`` non-final files of a level, or fewer once the oldest
   is older than the level's window, merge into files of the next level;
2. write each merge as staged files (split at ``target_file_size``, each recording its
   ``level`` and the ``committed_at`` of its oldest rows) under
   ``_inorder/staging/c<seq>-<id>/`` (``<id>`` unique to this run, so a concurrent
   compactor that picked the same ``seq`` never touches these files), named
   ``*.parquet.staged``: no ``*.parquet`` glob sees it;
3. create ``_inorder/compactions/<seq:020d>.json`` *if absent*: the files it replaces and
   the new files with deterministic names ``compacted-<seq:010d>-<n:05d>.parquet``; a
   concurrent compactor that picked the same ``seq`` loses and deletes its staged files;
4. publish the new files, mark ``<seq>.done``: from then on
   :func:`~inorder.sinks.parquet.read_committed` reads the new files instead of the old ones;
5. after ``grace_seconds`` the replaced files are deleted (``<seq>.cleaned``), so a reader
   that listed the old state just before step 4 can still finish. Until then a reader that
   lists the data directories sees both the replaced files and their merged copy (rows
   twice): such readers want ``grace_seconds=0`` (see ``docs/sinks.md``).

Staging directories of compactions and output repairs that were killed before their commit
point are deleted at the end of the next compaction or repair (:func:`clean_stale_staging`).

Delta tables: ``DeltaTable.optimize.compact`` then ``vacuum`` with a retention period
(default 7 days, the Delta default).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inorder.errors import InorderError
from inorder.sinks.base import SinkError
from inorder.sinks.commit_log import (
    COMPACTIONS_DIR,
    DEFAULT_TARGET_FILE_SIZE,
    STAGED_SUFFIX,
    STAGING_DIR,
    LiveFile,
    complete_manifest,
    is_not_found,
    list_records,
    load_state,
    manifest_name,
    partition_dir,
    read_manifest,
)
from inorder.sinks.compaction_levels import (
    DEFAULT_FANOUT,
    DEFAULT_LEVELS,
    LevelSettings,
    Merge,
    check_level_settings,
    estimate_trigger,
)
from inorder.sinks.compaction_merge import merge_pieces, plan_merges
from inorder.sinks.parquet_writer import ROW_GROUP_BUFFER_BYTES
from inorder.sinks.proof import add_digests, format_digest, table_digest
from inorder.storage import fs as sfs

DEFAULT_GRACE_SECONDS = 3600.0
DEFAULT_DELTA_RETENTION_HOURS = 168  # 7 days, as Delta's own default


@dataclass
class CompactionReport:
    """What a compaction did (or would do, for a dry run)."""

    groups: list[list[str]] = field(default_factory=list)
    """Per new file: the files it replaces (relative paths)."""
    files_before: int = 0
    files_after: int = 0
    bytes_rewritten: int = 0
    deleted: list[str] = field(default_factory=list)
    """Obsolete files removed by cleanup."""
    dry_run: bool = False
    seq: int | None = None

    def summary(self) -> str:
        """One line for humans."""
        verb = "would merge" if self.dry_run else "merged"
        return (
            f"{verb} {sum(len(g) for g in self.groups)} files into {len(self.groups)} "
            f"({self.bytes_rewritten / 1e6:.1f} MB); files {self.files_before} -> "
            f"{self.files_after}; deleted {len(self.deleted)} obsolete files"
        )


def compact_parquet(
    path: str,
    storage_options: Mapping[str, str] | None = None,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    dry_run: bool = False,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    compression: str = "zstd",
    fanout: int = DEFAULT_FANOUT,
    levels: int = DEFAULT_LEVELS,
    full: bool = False,
    trigger_seconds: float | None = None,
    now: float | None = None,
    before_commit: Callable[[], None] | None = None,
) -> CompactionReport:
    """Merge small files of a Parquet dataset written by :class:`ParquetSink` by the level
    rule (``fanout`` files of a level into one of the next, up to level ``levels``).

    ``trigger_seconds`` (the interval between batches; default: estimated from the commit
    times in the log) sets the age windows, ``now`` the time they are measured at (default:
    the clock). ``full`` merges every non-final file of each partition, whatever its level
    and age. A merge's output may complete the next level: planning repeats, one record per
    round, until nothing is left to merge (at most ``levels`` rounds, a row moving up one
    level per round); a dry run plans the first round only. ``before_commit`` (a lease
    check) runs before each merge's commit point: raising there commits nothing.
    """
    check_level_settings(fanout, levels)
    location = sfs.resolve(path, storage_options)
    state = load_state(location)
    if not dry_run:
        # Finish compactions a crashed compactor left half-done. Pending *batch* manifests
        # belong to the writer (it may be publishing them right now): never touched here.
        for rel in state.pending:
            if rel.startswith(COMPACTIONS_DIR):
                complete_manifest(location, rel)
    report = CompactionReport(dry_run=dry_run)
    when = time.time() if now is None else now
    floor = -1
    for round_ in range(levels + 1):
        # Planning applies compactions not yet marked done too: their files are taken.
        planning = load_state(location, include_pending_compactions=True)
        floor = planning.compaction_floor
        live = list(planning.files.values())
        trigger = estimate_trigger(live) if trigger_seconds is None else trigger_seconds
        settings = LevelSettings(target_file_size, fanout, levels, trigger)
        merges = plan_merges(live, planning.partition_by, settings, when, full and not round_)
        if not round_:
            report.files_before = report.files_after = len(live)
        report.groups += [[f.path for f in m.files] for m in merges]
        report.bytes_rewritten += sum(m.size_bytes for m in merges)
        if dry_run:
            report.files_after -= sum(len(m.files) - 1 for m in merges)
            return report
        if not merges:
            break
        comp_ids, _, _ = list_records(location, COMPACTIONS_DIR)
        # Records folded into a commit checkpoint may be deleted (never the newest one);
        # the checkpoint's sequence number is a floor all the same.
        seq = max(comp_ids[-1] if comp_ids else -1, floor) + 1
        report.seq = seq
        written = _rewrite(
            location, planning.partition_by, merges, seq, compression, settings, before_commit
        )
        report.files_after += written - sum(len(m.files) for m in merges)
    clean_stale_staging(location, floor)
    report.deleted = cleanup_parquet(location, grace_seconds)
    return report


def _rewrite(
    location: sfs.Location,
    partition_by: list[str],
    merges: list[Merge[LiveFile]],
    seq: int,
    compression: str,
    settings: LevelSettings,
    before_commit: Callable[[], None] | None = None,
) -> int:
    """Write and commit record ``seq`` of ``merges``; returns the number of files written."""
    n = 0
    with StagedRecord(location, "compaction", seq, compression) as record:
        for merge in merges:
            pdir = partition_dir(partition_by, merge.files[0].partition_values)
            tiered: dict[str, Any] = {"level": merge.level}
            if merge.committed_at is not None:
                tiered["committed_at"] = merge.committed_at
            for piece in merge_pieces(location, merge, pdir, settings.target_file_size):
                stem = f"compacted-{seq:010d}-{n:05d}"
                values = merge.files[0].partition_values
                record.stage_tables(piece.tables(), piece.schema, pdir, stem, values, **tiered)
                n += 1
        if before_commit is not None:
            before_commit()
        record.commit(
            [f.path for m in merges for f in m.files],
            taken=SinkError(
                f"{location.uri}: another compaction committed #{seq} first; run again"
            ),
        )
    return n


class StagedRecord:
    """Record ``seq`` of ``_inorder/compactions`` (a compaction or an output repair) in the
    making: its new files are staged apart, then one manifest created if absent commits them.

    Used around the work that writes the files::

        with StagedRecord(location, "repair", seq, compression) as record:
            record.stage(table, directory, stem, partition_values)  # per new file
            record.commit(replaces, taken=InorderError(...))

    Before :meth:`commit` creates ``_inorder/compactions/<seq:020d>.json`` (the commit
    point), an exception deletes every staged file. Leaving the block after the commit
    publishes the new files and marks the record done (:func:`complete_manifest`); if that
    fails, or the block raises after the commit, the staged files stay: the manifest names
    them and the next compaction or repair finishes the publication.
    """

    def __init__(
        self,
        location: sfs.Location,
        kind: Literal["compaction", "repair"],
        seq: int,
        compression: str,
    ) -> None:
        self.location = location
        self.kind = kind
        self.seq = seq
        self.compression = compression
        self.staging = staging_dir(kind[0], seq)
        """Relative path of this run's staging directory (``c<seq>-<id>`` or ``r<seq>-<id>``)."""
        self.rel = f"{COMPACTIONS_DIR}/{manifest_name(seq)}"
        """Relative path of the manifest."""
        self.files: list[dict[str, Any]] = []
        """The manifest's ``files`` entries, one per staged file."""
        self._committed = False

    def stage(
        self,
        table: pa.Table,
        directory: str,
        stem: str,
        partition_values: Mapping[str, str | None],
        **fields: Any,
    ) -> None:
        """Write ``table`` as a staged file to be published as ``<directory>/<stem>.parquet``;
        ``fields`` go into its manifest entry (a compaction's ``level``, ``committed_at``)."""
        location = self.location
        staged = "/".join(p for p in (self.staging, directory, stem + STAGED_SUFFIX) if p)
        full = location.join(staged)
        if not location.is_s3:
            location.filesystem.create_dir(full.rsplit("/", 1)[0], recursive=True)
        with location.filesystem.open_output_stream(full) as out:
            pq.write_table(table, out, compression=self.compression)
        digest = format_digest(table_digest(table))
        self._add(staged, directory, stem, table.num_rows, partition_values, digest, fields)

    def stage_tables(
        self,
        tables: Iterable[pa.Table],
        schema: pa.Schema,
        directory: str,
        stem: str,
        partition_values: Mapping[str, str | None],
        **fields: Any,
    ) -> None:
        """:meth:`stage` of the rows of ``tables`` (each of ``schema``) as one file, holding
        at most a row group's worth (:data:`ROW_GROUP_BUFFER_BYTES`) of them in memory."""
        location = self.location
        staged = "/".join(p for p in (self.staging, directory, stem + STAGED_SUFFIX) if p)
        full = location.join(staged)
        if not location.is_s3:
            location.filesystem.create_dir(full.rsplit("/", 1)[0], recursive=True)
        rows = digest = size = 0
        pending: list[pa.Table] = []
        with (
            location.filesystem.open_output_stream(full) as out,
            pq.ParquetWriter(out, schema, compression=self.compression) as writer,
        ):
            for table in tables:
                rows += table.num_rows
                digest = add_digests(digest, table_digest(table))
                pending.append(table)
                size += table.nbytes
                if size >= ROW_GROUP_BUFFER_BYTES:
                    writer.write_table(pa.concat_tables(pending))
                    pending, size = [], 0
            if pending:
                writer.write_table(pa.concat_tables(pending))
        self._add(staged, directory, stem, rows, partition_values, format_digest(digest), fields)

    def _add(
        self,
        staged: str,
        directory: str,
        stem: str,
        rows: int,
        partition_values: Mapping[str, str | None],
        digest: str,
        fields: Mapping[str, Any],
    ) -> None:
        """The manifest entry of a file just staged."""
        self.files.append(
            {
                "staged": staged,
                "final": "/".join(p for p in (directory, stem + ".parquet") if p),
                "rows": rows,
                "size_bytes": int(
                    self.location.filesystem.get_file_info(self.location.join(staged)).size or 0
                ),
                "partition_values": partition_values,
                "digest": digest,
                **fields,
            }
        )

    def commit(self, replaces: list[str], taken: InorderError, **fields: Any) -> str:
        """Create the manifest (the commit point): the staged files replace ``replaces``.

        ``fields`` are recorded in the manifest too. ``taken`` is raised when another run
        committed ``seq`` first. Returns the manifest's relative path.
        """
        manifest = {
            "format": 1,
            "kind": self.kind,
            "seq": self.seq,
            "created_at": time.time(),
            **fields,
            "replaces": replaces,
            "files": self.files,
        }
        try:
            sfs.put_if_absent(
                self.location, self.location.join(self.rel), json.dumps(manifest).encode()
            )
        except sfs.AlreadyExists:
            raise taken from None
        self._committed = True
        return self.rel

    def __enter__(self) -> StagedRecord:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        location = self.location
        staging = location.join(self.staging)
        if self._committed:
            if exc_type is None:
                complete_manifest(location, self.rel)
                sfs.delete_dir_quietly(location, staging)
            return
        _delete_tree(location, staging)


def _delete_tree(location: sfs.Location, path: str) -> None:
    """Delete a staging directory and everything in it (on S3, also keys written meanwhile)."""
    sfs.delete_dir_quietly(location, path)
    for leftover in sfs.list_files(location, path, recursive=True):
        sfs.delete_quietly(location, leftover.path)


def remove_replaced(location: sfs.Location, seq: int, replaces: list[str]) -> None:
    """Delete the files that record ``seq`` replaced, then mark the record cleaned."""
    for rel in replaces:
        sfs.delete_quietly(location, location.join(rel))
    sfs.write_bytes(location, _record_base(location, seq) + ".cleaned", b"{}")


def _record_base(location: sfs.Location, seq: int) -> str:
    """Path of record ``seq``'s manifest without ``.json`` (``.done``/``.cleaned`` follow)."""
    return location.join(COMPACTIONS_DIR, manifest_name(seq).removesuffix(".json"))


def staging_dir(kind: str, seq: int) -> str:
    """A fresh staging directory for compaction (``kind`` ``c``) or repair (``r``) ``seq``.

    Unique per run: two runs that picked the same ``seq`` stage apart, so the one that
    loses the create-if-absent deletes only its own files.
    """
    return f"{STAGING_DIR}/{kind}{seq}-{uuid.uuid4().hex[:12]}"


def _staging_seq(name: str) -> int | None:
    """``seq`` of a compaction/repair staging directory (``c<seq>[-<id>]``), else ``None``."""
    if name[:1] not in ("c", "r"):
        return None
    digits = name[1:].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


def clean_stale_staging(location: sfs.Location, floor: int = -1) -> list[str]:
    """Delete staging directories of compactions and repairs that can no longer commit.

    The directory of a run that picked sequence number ``seq`` is stale once a record of
    ``seq`` or a later one exists (that run lost the race for ``seq``, or was killed) and no
    record still being published names a file in it. Runs staging for a ``seq`` above every
    record (and above ``floor``, the sequence number folded into the newest commit
    checkpoint) are left alone: they may be writing right now. Returns the deleted
    directories (relative paths).
    """
    comp_ids, done, _ = list_records(location, COMPACTIONS_DIR)
    newest = max(comp_ids[-1] if comp_ids else -1, floor)
    needed: set[str] = set()
    for seq in comp_ids:
        if seq in done:
            continue
        try:
            manifest = read_manifest(location, f"{COMPACTIONS_DIR}/{manifest_name(seq)}")
        except OSError as exc:
            if is_not_found(exc):
                continue
            raise
        for entry in manifest["files"]:
            parts = str(entry["staged"]).split("/")
            if len(parts) > 3:
                needed.add(parts[2])
    deleted: list[str] = []
    for info in location.filesystem.get_file_info(
        pafs.FileSelector(location.join(STAGING_DIR), allow_not_found=True)
    ):
        of = _staging_seq(info.base_name)
        if of is None or of > newest or info.base_name in needed:
            continue
        _delete_tree(location, info.path)
        deleted.append(f"{STAGING_DIR}/{info.base_name}")
    return deleted


def cleanup_parquet(location: sfs.Location, grace_seconds: float) -> list[str]:
    """Delete files replaced by compactions done more than ``grace_seconds`` ago."""
    comp_ids, done, cleaned = list_records(location, COMPACTIONS_DIR)
    deleted: list[str] = []
    now = time.time()
    for seq in comp_ids:
        if seq not in done or seq in cleaned:
            continue
        try:
            marker = sfs.read_bytes(location, _record_base(location, seq) + ".done")
            done_at = json.loads(marker).get("done_at", 0.0)
            if now - float(done_at) < grace_seconds:
                continue
            manifest = read_manifest(location, f"{COMPACTIONS_DIR}/{manifest_name(seq)}")
        except OSError as exc:
            if is_not_found(exc):
                continue  # cleaned by another compactor, then removed by a commit checkpoint
            raise
        remove_replaced(location, seq, manifest["replaces"])
        deleted.extend(manifest["replaces"])
    return deleted


@dataclass
class DeltaCompactionReport:
    """What optimize + vacuum did on a Delta table."""

    files_added: int = 0
    files_removed: int = 0
    vacuumed: list[str] = field(default_factory=list)
    dry_run: bool = False

    def summary(self) -> str:
        """One line for humans."""
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"optimize: {self.files_removed} files -> {self.files_added}; vacuum {verb} "
            f"{len(self.vacuumed)} obsolete files"
        )


def compact_delta(
    path: str,
    storage_options: Mapping[str, str] | None = None,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    dry_run: bool = False,
    retention_hours: int = DEFAULT_DELTA_RETENTION_HOURS,
) -> DeltaCompactionReport:
    """``optimize.compact`` (not in a dry run) then ``vacuum`` older than ``retention_hours``."""
    from deltalake import DeltaTable

    location = sfs.resolve(path, storage_options)
    secrets = (location.s3.secret_access_key,) if location.s3 else ()
    try:
        table = DeltaTable(location.delta_uri(), storage_options=location.storage_options())
        report = DeltaCompactionReport(dry_run=dry_run)
        if not dry_run:
            metrics = table.optimize.compact(target_size=target_file_size)
            report.files_added = int(metrics.get("numFilesAdded", 0))
            report.files_removed = int(metrics.get("numFilesRemoved", 0))
        report.vacuumed = list(
            table.vacuum(
                retention_hours=retention_hours,
                dry_run=dry_run,
                enforce_retention_duration=False,
            )
        )
    except SinkError:
        raise
    except Exception as exc:
        raise SinkError(f"{path}: compaction failed: {sfs.describe_error(exc, secrets)}") from None
    return report
