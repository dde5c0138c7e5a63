"""``inorder compact --format delta``: a Delta table's merges by the level rule, round after
round (:mod:`inorder.sinks.delta_compaction`), then ``vacuum`` of the files no recent version
references."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inorder.sinks.base import SinkError
from inorder.sinks.commit_log import DEFAULT_TARGET_FILE_SIZE
from inorder.sinks.compaction import DEFAULT_DELTA_RETENTION_HOURS
from inorder.sinks.compaction_levels import (
    DEFAULT_FANOUT,
    DEFAULT_LEVELS,
    DEFAULT_MAX_MERGE_BYTES,
    LevelSettings,
)
from inorder.sinks.delta_compaction import DeltaTarget, compact_delta_levels
from inorder.storage import fs as sfs


@dataclass
class DeltaCompactionReport:
    """What ``inorder compact --format delta`` did: merges by the level rule, then vacuum."""

    files_before: int = 0
    merges: int = 0
    files_removed: int = 0
    files_added: int = 0
    bytes_rewritten: int = 0
    vacuumed: list[str] = field(default_factory=list)
    dry_run: bool = False

    def summary(self) -> str:
        """One line for humans."""
        if self.dry_run:
            merged = f"would merge {self.files_removed} of {self.files_before} files"
            vacuum = "would remove"
        else:
            merged = f"merged {self.files_removed} of {self.files_before} files into "
            merged += str(self.files_added)
            vacuum = "removed"
        return (
            f"{merged} in {self.merges} merges ({self.bytes_rewritten / 1e6:.1f} MB); "
            f"vacuum {vacuum} {len(self.vacuumed)} obsolete files"
        )


def compact_delta(
    path: str,
    storage_options: Mapping[str, str] | None = None,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    dry_run: bool = False,
    retention_hours: int = DEFAULT_DELTA_RETENTION_HOURS,
    fanout: int = DEFAULT_FANOUT,
    levels: int = DEFAULT_LEVELS,
    full: bool = False,
    max_merge_bytes: int = DEFAULT_MAX_MERGE_BYTES,
    compression: str = "zstd",
) -> DeltaCompactionReport:
    """Merge the table's small files by the level rule (``full``: every non-final file of
    each partition in the first round), round after round until nothing is due (at most
    ``levels + 1``), then ``vacuum`` files removed more than ``retention_hours`` ago."""
    from deltalake import DeltaTable

    location = sfs.resolve(path, storage_options)
    secrets = (location.s3.secret_access_key,) if location.s3 else ()
    report = DeltaCompactionReport(dry_run=dry_run)
    try:
        table = DeltaTable(location.delta_uri(), storage_options=location.storage_options())
        columns = list(table.metadata().partition_columns)
        target = DeltaTarget(location, columns, compression, f"Delta table {path}")
        settings = LevelSettings(target_file_size, fanout, levels, None, max_merge_bytes)
        for round_ in range(levels + 1):
            done = compact_delta_levels(target, settings, dry_run, full and not round_)
            if not round_:
                report.files_before = done.files_before
            removed = sum(len(g) for g in done.groups)
            report.merges += len(done.groups)
            report.files_removed += removed
            if not dry_run:
                report.files_added += done.files_after - done.files_before + removed
            report.bytes_rewritten += done.bytes_rewritten
            if dry_run or not done.groups:
                break
        report.vacuumed = list(
            table.vacuum(
                retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=False
            )
        )
    except SinkError:
        raise
    except Exception as exc:
        raise SinkError(f"{path}: compaction failed: {sfs.describe_error(exc, secrets)}") from None
    return report


__all__ = ["DeltaCompactionReport", "compact_delta"]
