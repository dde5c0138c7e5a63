"""Merges of a Parquet dataset's files: which (:func:`plan_merges`), and reading a merge's
input files as one stream of rows split into its output files (:func:`merge_pieces`).

A merge of tiered compaction (:mod:`inorder.sinks.compaction_levels`) may read ``k`` files
of up to 3/4 of the target size each: far more than fits in memory at once. The stream
reads one input file at a time and checks its row count against the manifests;
:func:`merge_pieces` cuts it into output files of equal row counts, as many as the merge's
size needs at ``target_file_size``, and keeps files of different schemas apart. The writer
of each piece
(:meth:`~inorder.sinks.compaction_records.StagedRecord.stage_tables`) holds one row group at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from inorder.sinks.base import SinkError
from inorder.sinks.commit_log import LiveFile
from inorder.sinks.compaction_levels import (
    LevelSettings,
    Merge,
    age_due,
    output_pieces,
    plan_levels,
)
from inorder.storage import fs as sfs


def plan_merges(
    files: list[LiveFile] | Mapping[str, list[LiveFile]],
    partition_by: list[str],
    settings: LevelSettings,
    now: float,
    full: bool = False,
    partitions: Collection[str] | None = None,
) -> list[Merge[LiveFile]]:
    """Pure planning: the level rule (:mod:`inorder.sinks.compaction_levels`) per partition
    directory; ``full`` merges every non-final file of a partition at once.

    ``partitions`` (directories, as :func:`~inorder.sinks.commit_log.partition_dir` names
    them) plans only those; ``None`` plans every partition. ``files`` may be grouped already
    (:func:`partition_files`, then ``partitions`` is not applied again).
    """
    grouped = (
        files if isinstance(files, Mapping) else partition_files(files, partition_by, partitions)
    )
    return plan_levels(grouped, now, settings, full)


def partition_files(
    files: list[LiveFile], partition_by: list[str], partitions: Collection[str] | None = None
) -> dict[str, list[LiveFile]]:
    """The live files per partition directory, in commit-log order (only ``partitions``,
    unless ``None``).

    A published file's name is ``<partition dir>/<name>`` (:func:`final_name`, and the
    compacted files staged under the same directory), so files are grouped by their name's
    directory: escaping every file's partition values (``partition_dir``) cost seconds per
    round at 100,000 live files, all of it holding the GIL. ``partition_by`` names the
    layout (unused: the directory already says it).
    """
    del partition_by
    wanted = None if partitions is None else set(partitions)
    by_partition: dict[str, list[LiveFile]] = {}
    for f in files:
        pdir = file_dir(f.path)
        if wanted is None or pdir in wanted:
            by_partition.setdefault(pdir, []).append(f)
    return by_partition


def due_by_age(
    files: list[LiveFile] | Mapping[str, list[LiveFile]],
    partition_by: list[str],
    settings: LevelSettings,
    partitions: Collection[str] | None = None,
) -> dict[str, float]:
    """Per partition directory with a merge by age ahead, when it falls due
    (:func:`~inorder.sinks.compaction_levels.age_due`); ``files`` may be grouped already
    (:func:`partition_files`, then ``partitions`` is not applied again)."""
    grouped = (
        files if isinstance(files, Mapping) else partition_files(files, partition_by, partitions)
    )
    due: dict[str, float] = {}
    for pdir, live in grouped.items():
        when = age_due(live, settings)
        if when is not None:
            due[pdir] = when
    return due


def file_dir(path: str) -> str:
    """The directory of a published file's relative path (``""`` at the dataset's root)."""
    return path.rpartition("/")[0]


class MergeStream:
    """The rows of files of one schema, read one file at a time, handed out piece by piece."""

    def __init__(
        self, location: sfs.Location, files: Sequence[LiveFile], schema: pa.Schema, where: str
    ) -> None:
        self.schema = schema
        self._tables = (self._read(location, f, where) for f in files)
        self._carry: pa.Table | None = None

    @staticmethod
    def _read(location: sfs.Location, f: LiveFile, where: str) -> pa.Table:
        table = pq.read_table(location.join(f.path), filesystem=location.filesystem)
        if table.num_rows != f.rows:  # the manifests are the truth: never lose a row
            raise SinkError(
                f"{location.uri}: {f.path} in {where} holds {table.num_rows} rows, the "
                f"manifests say {f.rows}; not compacting"
            )
        return table

    def take(self, rows: int) -> Iterator[pa.Table]:
        """The next ``rows`` rows, as slices of the files."""
        while rows > 0:
            if self._carry is None or not self._carry.num_rows:
                self._carry = next(self._tables, None)
                if self._carry is None:
                    return
            head = self._carry.slice(0, rows)
            self._carry = self._carry.slice(head.num_rows)
            rows -= head.num_rows
            yield head


@dataclass
class MergePiece:
    """One output file of a merge: the next ``rows`` rows of the stream."""

    stream: MergeStream
    rows: int

    @property
    def schema(self) -> pa.Schema:
        """The schema of the file (that of its input files)."""
        return self.stream.schema

    def tables(self) -> Iterator[pa.Table]:
        """Its rows, a slice of an input file at a time."""
        return self.stream.take(self.rows)


def merge_pieces(
    location: sfs.Location, merge: Merge[LiveFile], where: str, target_file_size: int
) -> Iterator[MergePiece]:
    """A merge's output files, split at the target size by rows; only one input file and
    one row group are in memory at a time, however large the merge.

    Input files of different schemas (before and after a compatible evolution) go to
    different output files: a file's digest covers the columns it stores, so a row must keep
    exactly its columns for the merged files' digests to add up to the inputs'.
    """
    where = where or "the dataset"
    runs: list[tuple[pa.Schema, list[LiveFile]]] = []
    for f in merge.files:
        schema = pq.read_schema(location.join(f.path), filesystem=location.filesystem)
        if runs and runs[-1][0].equals(schema, check_metadata=False):
            runs[-1][1].append(f)
        else:
            runs.append((schema, [f]))
    for schema, files in runs:
        stream = MergeStream(location, files, schema, where)
        total = sum(f.rows for f in files)
        size = sum(f.size_bytes for f in files)
        step = max(1, math.ceil(total / output_pieces(size, target_file_size)))
        yield MergePiece(stream, step)
        for _ in range(step, total, step):
            yield MergePiece(stream, step)
        # Every input file is read (and its rows checked) before the record commits.
        if any(True for _ in stream.take(1)):
            raise SinkError(f"{location.uri}: {where} holds more rows than its manifests say")


class RowPieces:
    """Rows cut into files of ``step`` rows, each written by ``write`` (which returns the
    file's relative path) from buffers of at most about a row group (the table formats'
    merges: Iceberg, Delta)."""

    def __init__(self, step: int, write: Callable[[list[pa.Table]], str]) -> None:
        self.step = step
        self.write = write
        self.written: list[str] = []
        self._buffer: list[pa.Table] = []
        self._rows = 0

    def add(self, data: pa.Table) -> None:
        """Buffer ``data``, writing a file each time ``step`` rows are buffered."""
        while data.num_rows:
            head = data.slice(0, self.step - self._rows)
            data = data.slice(head.num_rows)
            self._buffer.append(head)
            self._rows += head.num_rows
            if self._rows == self.step:
                self._flush()

    def close(self) -> None:
        """Write what is buffered (at least one file, even of no rows)."""
        if self._buffer or not self.written:
            self._flush()

    def _flush(self) -> None:
        self.written.append(self.write(self._buffer))
        self._buffer, self._rows = [], 0
