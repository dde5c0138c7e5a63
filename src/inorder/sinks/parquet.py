"""Exactly-once Parquet datasets on local disk or S3, committed per micro-batch.

Layout under the dataset root (``docs/sinks.md`` describes the protocol for readers)::

    <root>/<col>=<value>/.../part-<batch_id:010d>-<n:05d>.parquet   published data (hive style)
    <root>/<col>=<value>/.../compacted-<seq:010d>-<n:05d>.parquet   published by compaction
    <root>/_inorder/staging/<batch_id>/<task_key>/<col>=<value>/part-<n:05d>.parquet.staged
    <root>/_inorder/commits/<batch_id:020d>.json    batch manifest, created if absent
    <root>/_inorder/commits/<batch_id:020d>.done     the manifest's files are all published
    <root>/_inorder/commits/<batch_id:020d>.checkpoint.json   live files as of that batch
    <root>/_inorder/compactions/<seq:020d>.json|.done|.cleaned

Commit of batch ``B`` (driver):

1. finish any half-done commit left by a crashed driver (once per process);
2. if ``commits/B.json`` exists the batch is committed: delete the new staged files, return
   ``False``;
3. create ``commits/B.json`` *if absent* (``link(2)`` locally, ``PUT If-None-Match: *`` on S3)
   listing each staged file and its deterministic final name; this is the commit point;
4. publish each file (``rename`` locally, server-side copy then delete on S3), skipping those
   already published;
5. create ``commits/B.done`` and delete the batch's staging directory (and those of earlier
   batches: files of failed attempts).

A crash anywhere before 3 leaves only staged files (invisible, deleted later); after 3 the
manifest decides and step 4 is redone from it by the next process.

Staged files (also those of compaction, ``staging/c<seq>-<id>/``, and of output repair,
``staging/r<seq>-<id>/``) end in :data:`STAGED_SUFFIX`, not ``.parquet``: no ``*.parquet``
glob matches them, also one that enters ``_inorder/`` (DuckDB's ``**`` does). Publishing
renames them to their final ``.parquet`` names. Manifests record both names, so one written
by a release that staged under ``.parquet`` names is completed all the same.

The names, manifests, committed state and publication live in
:mod:`inorder.sinks.commit_log` (shared with compaction, commit checkpoints and output
repair; re-exported here). Every ``checkpoint_interval`` batches the commit log is
consolidated into a checkpoint and old manifests are deleted
(:mod:`inorder.sinks.commit_checkpoint`); :func:`load_state` starts from the newest
checkpoint.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inorder.sinks import fs as sfs
from inorder.sinks.base import BatchWriter, Sink, SinkError, WrittenFile
from inorder.sinks.commit_log import (  # noqa: F401  (the two caches: tests clear them)
    _CHECKPOINT_CACHE,
    _MANIFEST_CACHE,
    CHECKPOINT_SUFFIX,
    COMMITS_DIR,
    COMPACTIONS_DIR,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MANIFEST_RETENTION,
    DEFAULT_TARGET_FILE_SIZE,
    HIVE_NULL,
    LOAD_ATTEMPTS,
    META_DIR,
    STAGED_SUFFIX,
    STAGING_DIR,
    BatchIds,
    CommitListing,
    DatasetState,
    LiveFile,
    batch_owner,
    checkpoint_name,
    complete_manifest,
    decode_schema,
    encode_schema,
    file_batch_id,
    final_name,
    forget_manifest,
    is_not_found,
    list_commits,
    list_records,
    live_file,
    load_state,
    manifest_name,
    newest_checkpoint,
    partition_dir,
    read_checkpoint,
    read_manifest,
)
from inorder.sinks.evolution import schema_change

#: The sink, its readers, and the commit log's names (:mod:`inorder.sinks.commit_log`).
__all__ = [
    "CHECKPOINT_SUFFIX",
    "COMMITS_DIR",
    "COMPACTIONS_DIR",
    "COMPRESSIONS",
    "DEFAULT_CHECKPOINT_INTERVAL",
    "DEFAULT_MANIFEST_RETENTION",
    "DEFAULT_TARGET_FILE_SIZE",
    "HIVE_NULL",
    "LOAD_ATTEMPTS",
    "META_DIR",
    "ROW_GROUP_BUFFER_BYTES",
    "STAGED_SUFFIX",
    "STAGING_DIR",
    "TOTAL_BUFFER_BYTES",
    "BatchIds",
    "CommitListing",
    "DatasetState",
    "LiveFile",
    "ParquetBatchWriter",
    "ParquetSink",
    "batch_owner",
    "check_writable",
    "checkpoint_name",
    "committed_files",
    "complete_manifest",
    "decode_schema",
    "encode_schema",
    "file_batch_id",
    "final_name",
    "forget_manifest",
    "is_not_found",
    "list_commits",
    "list_records",
    "live_file",
    "load_state",
    "manifest_name",
    "newest_checkpoint",
    "partition_dir",
    "read_batch_range",
    "read_checkpoint",
    "read_committed",
    "read_manifest",
]

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


class ParquetBatchWriter(BatchWriter):
    """Writes one task's rows of a batch as Parquet files, one open file per partition.

    Rows of a partition go to one file until it reaches ``target_file_size``, then to the
    next: as few files per output partition as sizes allow. Partition columns are not stored
    in the files (hive style: their values are in the directory names). File names are
    ``<file_stem>-<n:05d><suffix>`` under ``prefix``.
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
        self._open: dict[tuple[str | None, ...], _Open] = {}
        self._written: list[WrittenFile] = []
        self._total_buffered = 0
        self._counter = 0

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
                self._flush(state)
        if self._total_buffered > TOTAL_BUFFER_BYTES:
            for state in sorted(self._open.values(), key=lambda s: -s.buffered_bytes):
                self._flush(state)
                if self._total_buffered <= TOTAL_BUFFER_BYTES // 2:
                    break

    def _flush(self, state: _Open) -> None:
        if not state.buffered:
            return
        data = pa.concat_tables(state.buffered).cast(self._file_schema)
        self._total_buffered -= state.buffered_bytes
        state.buffered, state.buffered_bytes = [], 0
        if state.writer is None:
            self._start_file(state)
        assert state.writer is not None
        state.writer.write_table(data, row_group_size=max(data.num_rows, 1))
        state.rows += data.num_rows
        if self._collect_stats:
            state.stats = _merge_stats(state.stats, data)
        if state.stream.tell() >= self._target:
            self._finish_file(state)

    def _start_file(self, state: _Open) -> None:
        name = f"{self._stem}-{self._counter:05d}{self._suffix}"
        rel = "/".join(p for p in (self._prefix, state.directory, name) if p)
        self._counter += 1
        full = self._location.join(rel)
        if not self._location.is_s3:
            self._location.filesystem.create_dir(full.rsplit("/", 1)[0], recursive=True)
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
                stats=_stats_json(state.rows, state.stats) if self._collect_stats else None,
            )
        )
        state.writer, state.stream, state.path, state.rows = None, None, "", 0
        state.stats = {}

    def close(self) -> list[WrittenFile]:
        """Flush all partitions and return the staged files."""
        for state in self._open.values():
            self._flush(state)
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


_STATS_TYPES = (pa.types.is_integer, pa.types.is_floating, pa.types.is_date)


def _merge_stats(stats: dict[str, list[Any]], data: pa.Table) -> dict[str, list[Any]]:
    """Fold min/max/null count of ``data`` into ``stats`` (numbers and dates only)."""
    for name in data.column_names:
        col = data.column(name)
        entry = stats.setdefault(name, [None, None, 0])
        entry[2] += col.null_count
        if not any(check(col.type) for check in _STATS_TYPES) or col.null_count == len(col):
            continue
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if isinstance(lo, float) and (lo != lo or hi != hi):  # NaN: no usable bounds
            continue
        entry[0] = lo if entry[0] is None else min(entry[0], lo)
        entry[1] = hi if entry[1] is None else max(entry[1], hi)
    return stats


def _stats_json(rows: int, stats: Mapping[str, list[Any]]) -> str:
    """Delta ``add.stats``: numRecords, minValues, maxValues, nullCount."""
    mins = {k: _json_value(v[0]) for k, v in stats.items() if v[0] is not None}
    maxs = {k: _json_value(v[1]) for k, v in stats.items() if v[1] is not None}
    nulls = {k: int(v[2]) for k, v in stats.items()}
    return json.dumps(
        {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )


def _json_value(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def _safe_key(task_key: str) -> str:
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


# -- the sink ----------------------------------------------------------------------------------


class ParquetSink(Sink):
    """A hive-partitioned Parquet dataset committed exactly once per micro-batch.

    ``path`` is a local path, ``file://`` URI or ``s3://bucket/prefix``; S3 settings come
    from ``storage_options`` or the AWS_* environment variables (see :mod:`inorder.sinks.fs`).
    With ``compact=True`` the driver merges small files after each commit
    (see :mod:`inorder.sinks.compaction`). Every ``checkpoint_interval`` committed batches
    the driver consolidates the commit log into one checkpoint and deletes manifests older
    than ``manifest_retention`` batches before it (see :mod:`inorder.sinks.commit_checkpoint`);
    ``checkpoint_interval=0`` keeps every manifest.
    """

    def __init__(
        self,
        path: str,
        partition_by: Sequence[str] = (),
        compression: str = "zstd",
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        storage_options: Mapping[str, str] | None = None,
        compact: bool = False,
        compaction_grace_seconds: float = 3600.0,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        manifest_retention: int = DEFAULT_MANIFEST_RETENTION,
    ) -> None:
        if compression.lower() not in COMPRESSIONS:
            raise SinkError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        if target_file_size <= 0:
            raise SinkError("target_file_size must be > 0")
        if checkpoint_interval < 0:
            raise SinkError(f"checkpoint_interval must be >= 0, not {checkpoint_interval}")
        if manifest_retention < 1:
            raise SinkError(f"manifest_retention must be >= 1, not {manifest_retention}")
        self.path = str(path)
        self.partition_by = list(partition_by)
        self.compression = compression.lower()
        self.target_file_size = int(target_file_size)
        self.storage_options = dict(storage_options) if storage_options else None
        self.compact = compact
        self.compaction_grace_seconds = compaction_grace_seconds
        self.checkpoint_interval = int(checkpoint_interval)
        self.manifest_retention = int(manifest_retention)
        self._checkpointed: int | None = None
        """Batch id of the newest commit checkpoint, as of the last recovery or write."""
        self._location: sfs.Location | None = None
        self._schema: pa.Schema | None = None
        self._recovered = False

    def __repr__(self) -> str:
        return f"ParquetSink({self.path!r}, partition_by={self.partition_by!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_location"] = None  # re-resolved on the executor
        state["_recovered"] = False
        state["_checkpointed"] = None
        return state

    @property
    def location(self) -> sfs.Location:
        """The resolved root (filesystem + path)."""
        if self._location is None:
            self._location = sfs.resolve(self.path, self.storage_options)
        return self._location

    def describe(self) -> str:
        """One line for humans."""
        parts = f", partitioned by {', '.join(self.partition_by)}" if self.partition_by else ""
        return f"Parquet dataset {self.path} ({self.compression}{parts})"

    def beside(self, suffix: str, partition_by: Sequence[str]) -> ParquetSink:
        """A Parquet dataset at ``path + suffix``, compressed and stored like this one."""
        return ParquetSink(
            self.path.rstrip("/") + suffix,
            partition_by,
            compression=self.compression,
            storage_options=self.storage_options,
        )

    # -- driver ------------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> None:
        """Fail with :class:`SinkError` unless the location is reachable and writable."""
        for col in self.partition_by:
            if col not in schema.names:
                raise SinkError(f"{self.path}: partition_by column {col!r} is not in the output")
            if pa.types.is_nested(schema.field(col).type):
                raise SinkError(f"{self.path}: partition_by column {col!r} has a nested type")
        if len(self.partition_by) == len(schema.names):
            raise SinkError(f"{self.path}: every output column is a partition column")
        check_writable(self.location)
        self._schema = schema
        self._recover()
        self._check_owner()
        self._check_schema(schema)

    def _check_schema(self, schema: pa.Schema) -> None:
        """Refuse output rows the committed files' schema cannot take in place."""
        if self.last_committed_batch() is None:
            return
        committed = load_state(self.location).schema
        if committed is None or committed.equals(schema, check_metadata=False):
            return
        compatible, changes = schema_change(committed.remove_metadata(), schema.remove_metadata())
        if not compatible:
            raise SinkError(
                f"{self.path}: the output schema changed incompatibly ({'; '.join(changes)}); "
                "the dataset holds rows of the old schema and files of two schemas must not "
                "mix. Write this output to a new path with a new checkpoint (or a new "
                "job_version); only adding nullable columns evolves a dataset in place"
            )

    def _check_owner(self) -> None:
        """Refuse a dataset whose last commit came from another pipeline checkpoint."""
        if self.owner is None:
            return
        last = self.last_committed_batch()
        if last is None:
            return
        theirs = batch_owner(self.location, last)
        if theirs != self.owner:
            raise SinkError(
                f"{self.path}: already holds output committed by another pipeline checkpoint "
                f"(batch {last}, owner {theirs or 'unknown'}); batch ids restart with every "
                "checkpoint, so new batches would be taken for committed ones. Use a new output "
                "path, or the checkpoint that wrote it"
            )

    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        """Executor: a writer staging this task's rows of ``batch_id``."""
        return ParquetBatchWriter(
            self.location,
            schema,
            self.partition_by,
            self.compression,
            self.target_file_size,
            prefix=f"{STAGING_DIR}/{batch_id}/{_safe_key(task_key)}",
            suffix=STAGED_SUFFIX,
        )

    def is_committed(self, batch_id: int) -> bool:
        """Whether the manifest of ``batch_id`` exists (its publication is then certain),
        or a commit checkpoint records the batch (its manifest may have been deleted)."""
        loc = self.location
        if sfs.exists(loc, loc.join(COMMITS_DIR, manifest_name(batch_id))):
            return True
        # A manifest is deleted only after a checkpoint recording its batch exists.
        doc = newest_checkpoint(loc)
        return doc is not None and batch_id in BatchIds(doc["batches"])

    def last_committed_batch(self) -> int | None:
        """The highest committed batch id, ``None`` when nothing was committed."""
        listing = list_commits(self.location)
        ids = listing.manifests + listing.checkpoints
        return max(ids) if ids else None

    def read_batches(self, first: int, last: int, columns: Sequence[str] | None = None) -> pa.Table:
        """The committed rows of batches ``first..last`` (by their ``batch_id`` column).

        Files of other batches are not opened: a published file's name carries its batch id
        (``part-<batch_id>-<n>``); compacted files mix batches and are filtered by row.
        """
        return read_batch_range(self.location, first, last, columns)

    def commit(self, batch_id: int, files: Sequence[WrittenFile]) -> bool:
        """Publish the batch's staged files atomically; ``False`` if it was committed already."""
        loc = self.location
        self._recover()
        prefix = f"{STAGING_DIR}/{batch_id}/"
        for f in files:
            if not f.path.startswith(prefix):
                raise SinkError(f"{self.path}: file {f.path} was not staged for batch {batch_id}")
        rel = f"{COMMITS_DIR}/{manifest_name(batch_id)}"
        if self._checkpointed is not None and batch_id <= self._checkpointed:
            # Its manifest may be gone: creating it again would publish the batch twice.
            if not self.is_committed(batch_id):
                raise SinkError(
                    f"{self.path}: batch {batch_id} is older than the commit checkpoint of "
                    f"batch {self._checkpointed} and was never committed"
                )
            for f in files:
                sfs.delete_quietly(loc, loc.join(f.path))
            self._clean_staging(batch_id)
            return False
        ordered = sorted(
            files, key=lambda f: (partition_dir(self.partition_by, f.partition_values), f.path)
        )
        entries = [
            {
                "staged": f.path,
                "final": final_name(
                    partition_dir(self.partition_by, f.partition_values), batch_id, n
                ),
                "rows": f.rows,
                "size_bytes": f.size_bytes,
                "partition_values": f.partition_values,
            }
            for n, f in enumerate(ordered)
        ]
        manifest: dict[str, Any] = {
            "format": 1,
            "kind": "batch",
            "batch_id": batch_id,
            "created_at": time.time(),
            "partition_by": self.partition_by,
            "owner": self.owner,
            "files": entries,
        }
        if self._schema is not None:
            manifest["schema"] = encode_schema(self._schema)
        try:
            sfs.put_if_absent(loc, loc.join(rel), json.dumps(manifest).encode())
        except sfs.AlreadyExists:
            # Committed before (a re-run after a crash): finish it if needed, drop new files.
            if not sfs.exists(loc, loc.join(rel.removesuffix(".json") + ".done")):
                complete_manifest(loc, rel)
            for f in files:
                sfs.delete_quietly(loc, loc.join(f.path))
            self._clean_staging(batch_id)
            return False
        complete_manifest(loc, rel)
        self._clean_staging(batch_id)
        if self.compact:
            from inorder.sinks.compaction import compact_parquet

            compact_parquet(
                self.path,
                storage_options=self.storage_options,
                target_file_size=self.target_file_size,
                grace_seconds=self.compaction_grace_seconds,
                compression=self.compression,
            )
        self._maybe_checkpoint(batch_id)
        return True

    def _maybe_checkpoint(self, batch_id: int) -> None:
        """Consolidate the commit log once ``checkpoint_interval`` batches passed."""
        if not self.checkpoint_interval:
            return
        last = -1 if self._checkpointed is None else self._checkpointed
        if batch_id - last < self.checkpoint_interval:
            return
        from inorder.sinks.commit_checkpoint import write_checkpoint

        written = write_checkpoint(self.location, self.manifest_retention)
        if written is not None:
            self._checkpointed = written

    def _recover(self) -> None:
        """Finish manifests a crashed process left half-published (once per process)."""
        if self._recovered:
            return
        state = load_state(self.location)
        for rel in state.pending:
            complete_manifest(self.location, rel)
        self._checkpointed = state.checkpoint
        self._recovered = True

    def _clean_staging(self, batch_id: int) -> None:
        """Delete staged files of this and earlier batches: leftovers of failed attempts."""
        loc = self.location
        selector = pafs.FileSelector(loc.join(STAGING_DIR), allow_not_found=True)
        for info in loc.filesystem.get_file_info(selector):
            name = info.base_name
            if name.isdigit() and int(name) <= batch_id:
                sfs.delete_dir_quietly(loc, info.path)
                if info.type == pafs.FileType.File:
                    sfs.delete_quietly(loc, info.path)
        if loc.is_s3:
            # Staged objects of a batch directory may be listed without a directory entry.
            for info in sfs.list_files(loc, loc.join(STAGING_DIR, str(batch_id)), recursive=True):
                sfs.delete_quietly(loc, info.path)


def check_writable(location: sfs.Location) -> None:
    """Probe the location with create-only writes and a delete; :class:`SinkError` if unusable.

    On S3 the probe is written twice and the second write must be refused: a store that
    ignores ``If-None-Match: *`` cannot commit exactly once, so it is refused here.
    """
    secrets = (location.s3.secret_access_key, location.s3.session_token) if location.s3 else ()
    probe = location.join(META_DIR, f"probe-{uuid.uuid4().hex}")
    try:
        if location.is_s3:
            sfs.check_conditional_writes(location, probe)
        else:
            location.filesystem.create_dir(location.join(COMMITS_DIR), recursive=True)
            sfs.put_if_absent(location, probe, b"probe")
            sfs.delete_quietly(location, probe)
    except PermissionError as exc:
        raise SinkError(f"{location.uri} is not writable: {exc.strerror}") from None
    except (SinkError, OSError) as exc:
        raise SinkError(
            f"{location.uri} is not usable: {sfs.describe_error(exc, secrets)}"
        ) from None


# -- readers -----------------------------------------------------------------------------------


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
            files[entry["final"]] = live_file(entry)
    if schema is None:
        return None
    state = DatasetState(files, [], [], schema, partition_by, [])
    try:
        return _read_files(location, state)
    except OSError:
        return None  # a file was compacted away: read from the full state


def _read_files(location: sfs.Location, state: DatasetState) -> pa.Table:
    paths = [location.join(f.path) for f in state.files.values()]
    schema = state.schema
    partition_by = state.partition_by
    if schema is not None:
        part_schema = pa.schema([schema.field(c) for c in partition_by])
    else:
        part_schema = pa.schema([pa.field(c, pa.string()) for c in partition_by])
    if not paths:
        if schema is not None:
            return schema.empty_table()
        return pa.table({})
    dataset = ds.dataset(
        paths,
        # The newest schema: files written before a compatible evolution (columns added as
        # nullable) read the new columns as null instead of deciding the schema themselves.
        schema=schema,
        filesystem=location.filesystem,
        format="parquet",
        partitioning=ds.partitioning(part_schema, flavor="hive") if partition_by else None,
        partition_base_dir=location.root,
    )
    table = dataset.to_table()
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    return table
