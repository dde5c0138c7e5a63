"""The executor side of the Parquet sink: a task's rows of a batch as staged Parquet files.

One open file per output partition, rolled at the target size; each file is reported as a
:class:`~inorder.sinks.base.WrittenFile` with Delta-style column statistics. Nothing here
is visible to readers until the driver commits the batch (:mod:`inorder.sinks.parquet`).
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inorder.errors import StorageError
from inorder.sinks.base import BatchWriter, WrittenFile
from inorder.sinks.commit_log import (
    partition_dir,
)
from inorder.sinks.delta_stats import merge_stats, stats_json
from inorder.sinks.proof import add_digests, format_digest, table_digest, table_digests
from inorder.storage import fs as sfs

COMPRESSIONS = ("zstd", "snappy", "gzip", "brotli", "lz4", "none")
#: Arrow bytes buffered per output partition before a row group is written: large row
#: groups compress better; the cap keeps memory bounded when a task has many partitions.
ROW_GROUP_BUFFER_BYTES = 64 * 1024 * 1024
TOTAL_BUFFER_BYTES = 256 * 1024 * 1024


# -- executor side -----------------------------------------------------------------------------


@dataclass
class _Open:
    """One output partition being written by a task."""

    values: dict[str, str | None]
    directory: str
    buffered: list[pa.Table] = field(default_factory=list)
    buffered_bytes: int = 0
    writer: pq.ParquetWriter | None = None
    stream: Any = None
    path: str = ""
    rows: int = 0
    stats: dict[str, list[Any]] = field(default_factory=dict)
    """Per column: [min, max, null_count] of the open file (Delta statistics)."""
    digest: int = 0
    """Digest of the rows written to the open file so far (:mod:`inorder.sinks.proof`)."""


def sort_keys(columns: Sequence[str], schema: pa.Schema) -> list[tuple[str, str]]:
    """Ascending sort keys for the ``columns`` that ``schema`` has (for :func:`sort_rows`)."""
    return [(c, "ascending") for c in columns if c in schema.names]


def sort_rows(table: pa.Table, keys: list[tuple[str, str]]) -> pa.Table:
    """``table``'s rows sorted by ``keys``, stably (rows of equal keys keep their order)."""
    if not keys or table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(table, sort_keys=keys))


class ParquetBatchWriter(BatchWriter):
    """Writes one task's rows of a batch as Parquet files, one open file per partition.

    Rows of a partition go to one file until it reaches ``target_file_size``, then to the
    next: as few files per output partition as sizes allow. Partition columns are not stored
    in the files (hive style: their values are in the directory names). File names are
    ``<file_stem>-<n:05d><suffix>`` under ``prefix``, in the partition's directory, or
    directly under ``prefix`` with ``flat=True`` (staged files, whose final names are
    given at commit from their partition values: no directory per partition to make and
    delete). With ``sort_by``, each row group's rows are sorted by those columns (stably:
    rows of equal keys keep their order), so the columns' statistics bound each row group.
    """

    def __init__(
        self,
        location: sfs.Location,
        schema: pa.Schema,
        partition_by: Sequence[str],
        compression: str,
        target_file_size: int,
        prefix: str,
        file_stem: str = "part",
        collect_stats: bool = False,
        suffix: str = ".parquet",
        flat: bool = False,
        sort_by: Sequence[str] = (),
    ):
        self._location = location
        self._partition_by = list(partition_by)
        self._compression = compression
        self._target = target_file_size
        self._file_schema = pa.schema(
            [f for f in schema if f.name not in set(partition_by)], metadata=schema.metadata
        )
        self._prefix = prefix
        self._stem = file_stem
        self._suffix = suffix
        self._collect_stats = collect_stats
        self._flat = flat
        self._sort = sort_keys(sort_by, self._file_schema)
        self._open: dict[tuple[str | None, ...], _Open] = {}
        self._written: list[WrittenFile] = []
        self._total_buffered = 0
        self._counter = 0
        #: Local directories this writer made (staged files share one: made once).
        self._made_dirs: set[str] = set()

    def write(self, batch: pa.RecordBatch) -> None:
        """Buffer rows; full row groups are written, full files are closed."""
        if batch.num_rows == 0:
            return
        table = pa.Table.from_batches([batch])
        for key, values, part in _split(table, self._partition_by):
            state = self._open.get(key)
            if state is None:
                state = _Open(values, partition_dir(self._partition_by, values))
                self._open[key] = state
            data = part.drop_columns(self._partition_by) if self._partition_by else part
            state.buffered.append(data)
            state.buffered_bytes += data.nbytes
            self._total_buffered += data.nbytes
            if state.buffered_bytes >= min(ROW_GROUP_BUFFER_BYTES, self._target):
                with self._writing(state):
                    self._flush(state)
        if self._total_buffered > TOTAL_BUFFER_BYTES:
            for state in sorted(self._open.values(), key=lambda s: -s.buffered_bytes):
                with self._writing(state):
                    self._flush(state)
                if self._total_buffered <= TOTAL_BUFFER_BYTES // 2:
                    break

    @contextlib.contextmanager
    def _writing(self, state: _Open) -> Iterator[None]:
        """A failed write as one line naming the staged file (a full disk, a lost store)."""
        try:
            yield
        except OSError as exc:
            loc = self._location
            where = loc.join(
                state.path or "/".join(p for p in (self._prefix, state.directory) if p)
            )
            uri = f"s3://{where}" if loc.is_s3 else where
            secrets = (loc.s3.secret_access_key, loc.s3.session_token) if loc.s3 else ()
            raise StorageError(
                f"cannot write staged file {uri}: {sfs.describe_error(exc, secrets)}; the batch "
                "was not committed: run again once the location is writable"
            ) from None

    def _flush(self, state: _Open) -> None:
        if state.buffered:
            data = self._take(state)
            # Hashed as written (after the cast to the file's types): what a verifier reads.
            self._write(state, data, table_digest(data))

    def _take(self, state: _Open) -> pa.Table:
        """The partition's buffered rows in the file's types; the buffer emptied."""
        data = pa.concat_tables(state.buffered).cast(self._file_schema)
        self._total_buffered -= state.buffered_bytes
        state.buffered, state.buffered_bytes = [], 0
        return sort_rows(data, self._sort)

    def _write(self, state: _Open, data: pa.Table, digest: int) -> None:
        """Append ``data`` (whose rows hash to ``digest``) to the partition's open file."""
        if state.writer is None:
            self._start_file(state)
        assert state.writer is not None
        state.writer.write_table(data, row_group_size=max(data.num_rows, 1))
        state.rows += data.num_rows
        state.digest = add_digests(state.digest, digest)
        if self._collect_stats:
            state.stats = merge_stats(state.stats, data)
        if state.stream.tell() >= self._target:
            self._finish_file(state)

    def _start_file(self, state: _Open) -> None:
        name = f"{self._stem}-{self._counter:05d}{self._suffix}"
        directory = "" if self._flat else state.directory
        rel = "/".join(p for p in (self._prefix, directory, name) if p)
        self._counter += 1
        full = self._location.join(rel)
        state.path = rel  # named by a failure from here on
        parent = full.rsplit("/", 1)[0]
        if not self._location.is_s3 and parent not in self._made_dirs:
            self._location.filesystem.create_dir(parent, recursive=True)
            self._made_dirs.add(parent)
        state.stream = self._location.filesystem.open_output_stream(full)
        state.writer = pq.ParquetWriter(
            state.stream, self._file_schema, compression=self._compression
        )
        state.path = rel
        state.rows = 0

    def _finish_file(self, state: _Open) -> None:
        if state.writer is None:
            return
        state.writer.close()
        size = int(state.stream.tell())
        state.stream.close()
        self._written.append(
            WrittenFile(
                path=state.path,
                rows=state.rows,
                size_bytes=size,
                partition_values=state.values,
                stats=stats_json(state.rows, state.stats) if self._collect_stats else None,
                digest=format_digest(state.digest),
            )
        )
        state.writer, state.stream, state.path, state.rows = None, None, "", 0
        state.stats, state.digest = {}, 0

    def close(self) -> list[WrittenFile]:
        """Flush all partitions and return the staged files."""
        states = list(self._open.values())
        pending = [s for s in states if s.buffered]
        datas = [self._take(s) for s in pending]
        # One hashing pass for every partition's last rows (with many topics, the files of
        # a task hold a few rows each: hashed one by one, that cost more than writing them).
        last = {id(s): (d, h) for s, d, h in zip(pending, datas, table_digests(datas), strict=True)}
        for state in states:
            with self._writing(state):
                if id(state) in last:
                    self._write(state, *last[id(state)])
                self._finish_file(state)
        self._open.clear()
        return list(self._written)

    def abort(self) -> None:
        """Close open files and delete everything this writer wrote."""
        paths = [f.path for f in self._written]
        for state in self._open.values():
            if state.path:
                paths.append(state.path)
            try:
                if state.writer is not None:
                    state.writer.close()
                if state.stream is not None:
                    state.stream.close()
            except Exception:  # deleted below anyway
                pass
        self._open.clear()
        self._written.clear()
        for rel in paths:
            sfs.delete_quietly(self._location, self._location.join(rel))


def safe_key(task_key: str) -> str:
    """A task key as one path segment (percent-encoded; never empty)."""
    return urllib.parse.quote(task_key, safe="-_.") or "task"


def _split(
    table: pa.Table, partition_by: Sequence[str]
) -> Iterator[tuple[tuple[str | None, ...], dict[str, str | None], pa.Table]]:
    """Rows of ``table`` grouped by partition values (row order kept within a group)."""
    if not partition_by:
        yield (), {}, table
        return
    keys = table.select(list(partition_by))
    indexed = keys.append_column("__row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    groups = indexed.group_by(list(partition_by), use_threads=False).aggregate([("__row", "list")])
    value_lists = [pc.cast(groups.column(col), pa.string()).to_pylist() for col in partition_by]
    rows_lists = groups.column("__row_list")
    for i in range(groups.num_rows):
        values = {col: value_lists[j][i] for j, col in enumerate(partition_by)}
        key = tuple(values[c] for c in partition_by)
        if groups.num_rows == 1:
            yield key, values, table
        else:
            yield key, values, table.take(rows_lists[i].values)
