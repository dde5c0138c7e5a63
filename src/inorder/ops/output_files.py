"""What a Parquet output or Delta table holds now: its live files by compaction level, and
the merges due.

Read from the commit log (a Delta table's log) alone, no data file is opened, so it is
cheap at any size: the
files a reader of the documented layout sees, how they stand on the level rule (level 0 is
a batch's file, level ``i + 1`` a merge of level ``i`` files), and what a compaction would
merge if it ran now (the compaction backlog: what the sink's compactor thread or
``inorder compact`` has still to do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inorder.sinks.base import Sink


@dataclass
class LevelFiles:
    """The live files of one compaction level."""

    level: int
    files: int
    bytes: int


@dataclass
class OutputFiles:
    """A Parquet output's live files and its compaction backlog."""

    files: int
    bytes: int
    rows: int
    partitions: int
    levels: list[LevelFiles] = field(default_factory=list)
    #: Merges the level rule would make now, and the files they would take.
    due_merges: int = 0
    due_files: int = 0


def output_files(sink: Sink) -> OutputFiles | None:
    """The files of ``sink`` when it is a Parquet output or a Delta table (``None`` for
    other outputs)."""
    from inorder.sinks.delta import DeltaSink
    from inorder.sinks.parquet import ParquetSink, committed_files

    inner: Any = sink
    while hasattr(inner, "inner"):  # job versions and repaired batch ids wrap the real one
        inner = inner.inner
    if isinstance(inner, DeltaSink):
        return _delta_files(inner)
    if not isinstance(inner, ParquetSink):
        return None
    return _summary(committed_files(inner.path, inner.storage_options), inner.compactor.plan())


def _delta_files(sink: Any) -> OutputFiles:
    from inorder.sinks.delta_compaction import live_files

    return _summary(live_files(sink.compactor.table.table()), sink.compactor.plan())


def _summary(live: Sequence[Any], due: Any) -> OutputFiles:
    """Live files (with ``level``, ``size_bytes``, ``rows``, ``partition_values``) and the
    merges the sink's compactor would make now (its own settings, nothing merged)."""
    by_level: dict[int, LevelFiles] = {}
    for f in live:
        entry = by_level.setdefault(f.level, LevelFiles(f.level, 0, 0))
        entry.files += 1
        entry.bytes += f.size_bytes
    return OutputFiles(
        files=len(live),
        bytes=sum(f.size_bytes for f in live),
        rows=sum(f.rows for f in live),
        partitions=len({tuple(sorted(f.partition_values.items())) for f in live}),
        levels=[by_level[k] for k in sorted(by_level)],
        due_merges=len(due.groups),
        due_files=sum(len(g) for g in due.groups),
    )


def format_output_files(doc: Mapping[str, Any]) -> list[str]:
    """Human lines for an :class:`OutputFiles` as a JSON document."""
    levels = ", ".join(
        f"{lv['level']}: {lv['files']:,} ({lv['bytes'] / 1e6:,.1f} MB)" for lv in doc["levels"]
    )
    due = (
        f"{doc['due_merges']:,} merge(s) of {doc['due_files']:,} files due now"
        if doc["due_merges"]
        else "nothing to merge now"
    )
    return [
        f"output: {doc['files']:,} files, {doc['bytes'] / 1e6:,.1f} MB, {doc['rows']:,} rows "
        f"in {doc['partitions']:,} partition(s); by level {levels or '-'}; compaction: {due}"
    ]


__all__ = ["LevelFiles", "OutputFiles", "format_output_files", "output_files"]
