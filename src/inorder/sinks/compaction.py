"""Merging small output files while the pipeline runs, and removing obsolete ones safely.

Parquet datasets (the manifest protocol of :mod:`inorder.sinks.parquet`):

1. plan from the committed state by the level rule (:mod:`inorder.sinks.compaction_levels`):
   per partition directory, ``fanout`` non-final files of a level, or fewer once the oldest
   is older than the level's window, merge into files of the next level, each merge reading
   at most ``max_merge_bytes``; a compactor told which partitions the latest batches
   touched plans only those (:mod:`inorder.sinks.parquet_compactor`);
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
point are deleted at the end of the next compaction or repair
(:func:`~inorder.sinks.compaction_records.clean_stale_staging`).

Delta tables: ``DeltaTable.optimize.compact`` then ``vacuum`` with a retention period
(default 7 days, the Delta default).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from inorder.sinks.base import SinkError
from inorder.sinks.commit_log import (
    COMPACTIONS_DIR,
    DEFAULT_TARGET_FILE_SIZE,
    LiveFile,
    complete_manifest,
    list_records,
    load_state,
    partition_dir,
)
from inorder.sinks.compaction_levels import (
    DEFAULT_FANOUT,
    DEFAULT_LEVELS,
    DEFAULT_MAX_MERGE_BYTES,
    LevelSettings,
    Merge,
    check_level_settings,
    check_max_merge_bytes,
    estimate_trigger,
)
from inorder.sinks.compaction_merge import (
    due_by_age,
    file_dir,
    merge_pieces,
    partition_files,
    plan_merges,
)
from inorder.sinks.compaction_records import StagedRecord, clean_stale_staging, cleanup_parquet
from inorder.sinks.topic_bucket import SORT_KEYS, TOPIC_BUCKET
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
    left: list[str] = field(default_factory=list)
    """Partition directories whose due merges the round's bound left for the next round."""
    due: dict[str, float] = field(default_factory=dict)
    """Per planned partition with a merge by age ahead, when it falls due (epoch seconds)."""

    def summary(self) -> str:
        """One line for humans."""
        verb = "would merge" if self.dry_run else "merged"
        return (
            f"{verb} {sum(len(g) for g in self.groups)} files into {len(self.groups)} "
            f"({self.bytes_rewritten / 1e6:.1f} MB); files {self.files_before} -> "
            f"{self.files_after}; deleted {len(self.deleted)} obsolete files"
            + (f"; {len(self.left)} partitions left for the next round" if self.left else "")
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
    max_merge_bytes: int = DEFAULT_MAX_MERGE_BYTES,
    partitions: Collection[str] | None = None,
    max_round_merges: int | None = None,
    max_round_bytes: int | None = None,
) -> CompactionReport:
    """Merge small files of a Parquet dataset written by :class:`ParquetSink` by the level
    rule (``fanout`` files of a level into one of the next, up to level ``levels``, each
    merge reading at most ``max_merge_bytes``).

    ``trigger_seconds`` (the interval between batches; default: estimated from the commit
    times in the log) sets the age windows, ``now`` the time they are measured at (default:
    the clock). ``full`` merges every non-final file of each partition, whatever its level
    and age. ``partitions`` (partition directories, e.g. ``topic=a``) plans only those, the
    ones the latest batches touched; ``None`` plans every partition. A merge's output may
    complete the next level: planning repeats, one record per round, until nothing is left
    to merge (at most ``levels`` rounds, a row moving up one level per round); a dry run
    plans the first round only. ``before_commit`` (a lease check) runs before each merge's
    commit point: raising there commits nothing.

    ``max_round_merges`` and ``max_round_bytes`` bound the call: it commits at most that many
    merges reading at most that many bytes in all (at least one merge, however large), and
    names the partitions it left due merges in (``report.left``) for the next call; ``None``:
    no bound.
    """
    check_level_settings(fanout, levels)
    check_max_merge_bytes(max_merge_bytes, target_file_size)
    budget = RoundBudget(max_round_merges, max_round_bytes)
    location = sfs.resolve(path, storage_options)
    report = CompactionReport(dry_run=dry_run)
    when = time.time() if now is None else now
    floor = -1
    for round_ in range(levels + 1):
        # Planning applies compactions not yet marked done too: their files are taken.
        planning = load_state(location, include_pending_compactions=True)
        if not dry_run and not round_:
            # Finish compactions a crashed compactor left half-done (the state above has
            # them applied already). Pending *batch* manifests belong to the writer (it may
            # be publishing them right now): never touched here.
            for rel in planning.pending:
                if rel.startswith(COMPACTIONS_DIR):
                    complete_manifest(location, rel)
        floor = planning.compaction_floor
        live = list(planning.files.values())
        trigger = estimate_trigger(live) if trigger_seconds is None else trigger_seconds
        settings = LevelSettings(
            target_file_size, fanout, levels, trigger, max_merge_bytes=max_merge_bytes
        )
        # Grouped once per planning: the merges and the age rule's due times both use it.
        grouped = partition_files(live, planning.partition_by, partitions)
        merges = plan_merges(grouped, planning.partition_by, settings, when, full and not round_)
        if not round_:
            report.files_before = report.files_after = len(live)
        if dry_run:
            report.groups += [[f.path for f in m.files] for m in merges]
            report.bytes_rewritten += sum(m.size_bytes for m in merges)
            report.files_after -= sum(len(m.files) - 1 for m in merges)
            return report
        if not merges:
            report.due = due_by_age(grouped, planning.partition_by, settings)
            break
        taken = budget.take(merges)
        if len(taken) < len(merges):
            # Every partition of this planning: those whose merges wait, and those whose
            # merges' outputs may complete the next level (planned again by the next call).
            report.left = sorted({file_dir(m.files[0].path) for m in merges})
            due = due_by_age(grouped, planning.partition_by, settings)
            report.due = {p: t for p, t in due.items() if p not in report.left}
            if not taken:
                break
        merges = taken
        report.groups += [[f.path for f in m.files] for m in merges]
        report.bytes_rewritten += sum(m.size_bytes for m in merges)
        comp_ids, _, _ = list_records(location, COMPACTIONS_DIR)
        # Records folded into a commit checkpoint may be deleted (never the newest one);
        # the checkpoint's sequence number is a floor all the same.
        seq = max(comp_ids[-1] if comp_ids else -1, floor) + 1
        report.seq = seq
        written = _rewrite(
            location, planning.partition_by, merges, seq, compression, settings, before_commit
        )
        report.files_after += written - sum(len(m.files) for m in merges)
        if report.left:
            break
    clean_stale_staging(location, floor)
    report.deleted = cleanup_parquet(location, grace_seconds)
    return report


@dataclass
class RoundBudget:
    """What one bounded call of :func:`compact_parquet` may still merge."""

    merges: int | None
    size_bytes: int | None
    _taken: int = 0

    def __post_init__(self) -> None:
        for name, value in (("merges", self.merges), ("bytes", self.size_bytes)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise SinkError(f"max_round_{name} must be an integer >= 1, not {value!r}")

    def take(self, merges: list[Merge[LiveFile]]) -> list[Merge[LiveFile]]:
        """The first of ``merges`` that fit in what is left (at least one, if nothing was
        taken yet: a merge larger than the bound still moves on, alone)."""
        taken: list[Merge[LiveFile]] = []
        for merge in merges:
            fits = (self.merges is None or self.merges >= 1) and (
                self.size_bytes is None or merge.size_bytes <= self.size_bytes
            )
            if not fits and self._taken:
                break
            taken.append(merge)
            self._taken += 1
            if self.merges is not None:
                self.merges -= 1
            if self.size_bytes is not None:
                self.size_bytes = max(0, self.size_bytes - merge.size_bytes)
        return taken


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
    # A bucketed output keeps its files' rows sorted by topic through merges too.
    order = SORT_KEYS if TOPIC_BUCKET in partition_by else ()
    with StagedRecord(location, "compaction", seq, compression) as record:
        for merge in merges:
            pdir = partition_dir(partition_by, merge.files[0].partition_values)
            tiered: dict[str, Any] = {"level": merge.level}
            if merge.committed_at is not None:
                tiered["committed_at"] = merge.committed_at
            for piece in merge_pieces(location, merge, pdir, settings.target_file_size):
                stem = f"compacted-{seq:010d}-{n:05d}"
                values = merge.files[0].partition_values
                record.stage_tables(
                    piece.tables(), piece.schema, pdir, stem, values, sort_by=order, **tiered
                )
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
