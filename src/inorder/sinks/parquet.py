"""Exactly-once Parquet datasets on local disk or S3, committed per micro-batch.

Layout under the dataset root (``docs/sinks.md`` describes the protocol for readers)::

    <root>/<col>=<value>/.../part-<batch_id:010d>-<n:05d>.parquet   published data (hive style)
    <root>/<col>=<value>/.../compacted-<seq:010d>-<n:05d>.parquet   published by compaction
    <root>/_inorder/staging/<batch_id>/<task_key>/<col>=<value>/part-<n:05d>.parquet
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

Every ``checkpoint_interval`` batches the commit log is consolidated into a checkpoint and
old manifests are deleted (:mod:`inorder.sinks.commit_checkpoint`); :func:`load_state`
starts from the newest checkpoint.
"""

from __future__ import annotations

import base64
import bisect
import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inorder.sinks import fs as sfs
from inorder.sinks.base import BatchWriter, Sink, SinkError, WrittenFile
from inorder.sinks.evolution import schema_change

META_DIR = "_inorder"
STAGING_DIR = f"{META_DIR}/staging"
COMMITS_DIR = f"{META_DIR}/commits"
COMPACTIONS_DIR = f"{META_DIR}/compactions"
CHECKPOINT_SUFFIX = ".checkpoint.json"
#: A commit checkpoint is written every this many committed batches.
DEFAULT_CHECKPOINT_INTERVAL = 100
#: Manifests of this many batches before the newest checkpoint are kept.
DEFAULT_MANIFEST_RETENTION = 100
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
COMPRESSIONS = ("zstd", "snappy", "gzip", "brotli", "lz4", "none")
#: Arrow bytes buffered per output partition before a row group is written: large row
#: groups compress better; the cap keeps memory bounded when a task has many partitions.
ROW_GROUP_BUFFER_BYTES = 64 * 1024 * 1024
TOTAL_BUFFER_BYTES = 256 * 1024 * 1024


def manifest_name(batch_id: int) -> str:
    """File name of a batch manifest inside ``_inorder/commits``."""
    return f"{batch_id:020d}.json"


def final_name(partition_dir: str, batch_id: int, n: int) -> str:
    """Deterministic published name of the ``n``-th file of ``batch_id``."""
    name = f"part-{batch_id:010d}-{n:05d}.parquet"
    return f"{partition_dir}/{name}" if partition_dir else name


def partition_dir(partition_by: Sequence[str], values: Mapping[str, str | None]) -> str:
    """Hive-style directory (``col=value/...``) of a partition; values are URI-escaped."""
    parts = []
    for col in partition_by:
        value = values.get(col)
        text = HIVE_NULL if value is None else urllib.parse.quote(value, safe="")
        parts.append(f"{col}={text}")
    return "/".join(parts)


def encode_schema(schema: pa.Schema) -> str:
    """An Arrow schema as base64 IPC (kept in manifests so readers restore exact types)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_schema(text: str) -> pa.Schema:
    """Inverse of :func:`encode_schema`."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


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
    in the files (hive style: their values are in the directory names).
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
        name = f"{self._stem}-{self._counter:05d}.parquet"
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


# -- the manifest log --------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveFile:
    """A published data file of the dataset."""

    path: str
    """Relative to the dataset root."""
    rows: int
    size_bytes: int
    partition_values: dict[str, str | None]


class BatchIds(Sequence[int]):
    """Committed batch ids kept as inclusive ranges: a long history costs a few numbers."""

    def __init__(self, ranges: Sequence[Sequence[int]] = ()) -> None:
        self._ranges: list[list[int]] = []
        for lo, hi in ranges:
            self._extend(int(lo), int(hi))

    def _extend(self, lo: int, hi: int) -> None:
        if self._ranges and lo <= self._ranges[-1][1] + 1:
            self._ranges[-1][1] = max(self._ranges[-1][1], hi)
        else:
            self._ranges.append([lo, hi])

    def append(self, batch_id: int) -> None:
        """Add ``batch_id`` (ids are added in increasing order)."""
        self._extend(batch_id, batch_id)

    def ranges(self) -> list[list[int]]:
        """The ids as ``[first, last]`` inclusive ranges, in order."""
        return [list(r) for r in self._ranges]

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self._ranges)

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self._ranges:
            yield from range(lo, hi + 1)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect.bisect_right([lo for lo, _ in self._ranges], value) - 1
        return i >= 0 and value <= self._ranges[i][1]

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += len(self)
        if index < 0:
            raise IndexError(index)
        for lo, hi in self._ranges:
            if index <= hi - lo:
                return lo + index
            index -= hi - lo + 1
        raise IndexError(index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchIds):
            return self._ranges == other._ranges
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"BatchIds({self._ranges!r})"


@dataclass
class DatasetState:
    """The committed content of a dataset: live files plus what the manifests say."""

    files: dict[str, LiveFile]
    batches: Sequence[int]
    """Ids of the done batches (a :class:`BatchIds` when read by :func:`load_state`)."""
    compactions: list[int]
    schema: pa.Schema | None
    partition_by: list[str]
    pending: list[str]
    """Manifests (relative paths) whose publication is not marked done."""
    checkpoint: int | None = None
    """Batch id of the commit checkpoint the state was read from, if any."""
    compaction_floor: int = -1
    """Highest compaction sequence number folded into that checkpoint (-1: none)."""
    owner: str | None = None
    """Owner recorded in the checkpoint (the owner of its last batch)."""


_MANIFEST_CACHE: dict[tuple[str, str], dict[str, Any]] = {}
#: The newest commit checkpoint read per dataset: (relative path, parsed document).
_CHECKPOINT_CACHE: dict[str, tuple[str, dict[str, Any]]] = {}
#: How often :func:`load_state` starts over when metadata it listed was deleted meanwhile
#: (by a checkpoint's cleanup); each retry sees a newer checkpoint.
LOAD_ATTEMPTS = 8


def read_manifest(location: sfs.Location, rel: str) -> dict[str, Any]:
    """Parse a manifest (immutable once created: cached per process)."""
    key = (location.uri, rel)
    cached = _MANIFEST_CACHE.get(key)
    if cached is None:
        cached = json.loads(sfs.read_bytes(location, location.join(rel)))
        if len(_MANIFEST_CACHE) > 100_000:
            _MANIFEST_CACHE.clear()
        _MANIFEST_CACHE[key] = cached
    return cached


def forget_manifest(location: sfs.Location, rel: str) -> None:
    """Drop a deleted manifest from the per-process cache."""
    _MANIFEST_CACHE.pop((location.uri, rel), None)


def checkpoint_name(batch_id: int) -> str:
    """File name of the commit checkpoint of ``batch_id`` inside ``_inorder/commits``."""
    return f"{batch_id:020d}{CHECKPOINT_SUFFIX}"


def read_checkpoint(location: sfs.Location, batch_id: int) -> dict[str, Any]:
    """Parse a commit checkpoint (immutable; the newest one per dataset is cached)."""
    rel = f"{COMMITS_DIR}/{checkpoint_name(batch_id)}"
    cached = _CHECKPOINT_CACHE.get(location.uri)
    if cached is not None and cached[0] == rel:
        return cached[1]
    doc: dict[str, Any] = json.loads(sfs.read_bytes(location, location.join(rel)))
    _CHECKPOINT_CACHE[location.uri] = (rel, doc)
    return doc


def is_not_found(exc: BaseException) -> bool:
    """Whether an error from a filesystem call means the file does not exist."""
    if isinstance(exc, FileNotFoundError):
        return True
    text = str(exc).lower()
    return isinstance(exc, OSError) and ("not found" in text or "does not exist" in text)


@dataclass
class CommitListing:
    """One listing of ``_inorder/commits``."""

    manifests: list[int]
    done: set[int]
    checkpoints: list[int]

    @property
    def newest_checkpoint(self) -> int | None:
        """Batch id of the newest commit checkpoint."""
        return self.checkpoints[-1] if self.checkpoints else None


def list_commits(location: sfs.Location) -> CommitListing:
    """Batch manifests, done markers and commit checkpoints in ``_inorder/commits``."""
    listing = CommitListing([], set(), [])
    for info in sfs.list_files(location, location.join(COMMITS_DIR)):
        stem, _, ext = info.base_name.partition(".")
        if not stem.isdigit():
            continue
        if ext == "json":
            listing.manifests.append(int(stem))
        elif ext == "done":
            listing.done.add(int(stem))
        elif "." + ext == CHECKPOINT_SUFFIX:
            listing.checkpoints.append(int(stem))
    listing.manifests.sort()
    listing.checkpoints.sort()
    return listing


def _listing(location: sfs.Location, directory: str) -> tuple[list[int], set[int], set[int]]:
    """Ids with a manifest, ids marked done, ids marked cleaned."""
    manifests: list[int] = []
    done: set[int] = set()
    cleaned: set[int] = set()
    for info in sfs.list_files(location, location.join(directory)):
        stem, _, ext = info.base_name.partition(".")
        if not stem.isdigit():
            continue
        if ext == "json":
            manifests.append(int(stem))
        elif ext == "done":
            done.add(int(stem))
        elif ext == "cleaned":
            cleaned.add(int(stem))
    return sorted(manifests), done, cleaned


def load_state(location: sfs.Location, include_pending_compactions: bool = False) -> DatasetState:
    """The committed dataset: files of done batch manifests, with done compactions applied.

    Compactions are listed *before* batches: a compaction only replaces files of batches
    that were done before it was created, so every file it replaces belongs to a batch this
    listing sees, and a reader never counts a batch's rows twice or partially.
    ``include_pending_compactions`` also applies compactions not yet marked done: a
    compactor plans with them so that no file is ever replaced twice.

    The state starts from the newest commit checkpoint (``<B>.checkpoint.json``: the live
    files as of batch ``B`` and compaction ``S``), then applies the done manifests after
    ``B`` and the compactions after ``S``. Manifests after a checkpoint are deleted only
    once that checkpoint is deleted, so if the checkpoint still exists when everything was
    read, nothing the state needed was missing; otherwise (or when a listed file vanished
    under a cleanup) the read starts over from the newer checkpoint.
    """
    for attempt in range(LOAD_ATTEMPTS):
        try:
            state = _load_state_once(location, include_pending_compactions)
        except OSError as exc:
            if not is_not_found(exc) or attempt == LOAD_ATTEMPTS - 1:
                raise
            continue
        if state.checkpoint is None:
            return state
        rel = f"{COMMITS_DIR}/{checkpoint_name(state.checkpoint)}"
        if sfs.exists(location, location.join(rel)):
            return state
    raise SinkError(
        f"{location.uri}: the commit log changed under every one of {LOAD_ATTEMPTS} reads"
    )


def _load_state_once(location: sfs.Location, include_pending_compactions: bool) -> DatasetState:
    comp_ids, comp_done, _ = _listing(location, COMPACTIONS_DIR)
    listing = list_commits(location)
    files: dict[str, LiveFile] = {}
    schema: pa.Schema | None = None
    partition_by: list[str] = []
    batches = BatchIds()
    base = listing.newest_checkpoint
    floor = -1
    owner: str | None = None
    if base is not None:
        doc = read_checkpoint(location, base)
        for entry in doc["files"]:
            files[entry["final"]] = _live(entry)
        batches = BatchIds(doc["batches"])
        floor = int(doc["compaction_seq"])
        if doc.get("schema"):
            schema = decode_schema(doc["schema"])
        partition_by = list(doc.get("partition_by", []))
        owner = doc.get("owner")
    pending: list[str] = []
    for bid in listing.manifests:
        if base is not None and bid <= base:
            continue  # folded into the checkpoint
        rel = f"{COMMITS_DIR}/{manifest_name(bid)}"
        if bid not in listing.done:
            pending.append(rel)
            continue
        manifest = read_manifest(location, rel)
        batches.append(bid)
        if manifest.get("schema"):
            schema = decode_schema(manifest["schema"])
        partition_by = list(manifest.get("partition_by", partition_by))
        for entry in manifest["files"]:
            files[entry["final"]] = _live(entry)
    compactions: list[int] = []
    for seq in comp_ids:
        if seq <= floor:
            continue  # folded into the checkpoint
        rel = f"{COMPACTIONS_DIR}/{manifest_name(seq)}"
        if seq not in comp_done:
            pending.append(rel)
            if not include_pending_compactions:
                continue
        manifest = read_manifest(location, rel)
        compactions.append(seq)
        for old in manifest["replaces"]:
            files.pop(old, None)
        for entry in manifest["files"]:
            files[entry["final"]] = _live(entry)
    return DatasetState(
        files, batches, compactions, schema, partition_by, pending, base, floor, owner
    )


def newest_checkpoint(location: sfs.Location) -> dict[str, Any] | None:
    """The newest commit checkpoint of a dataset, ``None`` if it has none."""
    for attempt in range(LOAD_ATTEMPTS):
        newest = list_commits(location).newest_checkpoint
        if newest is None:
            return None
        try:
            return read_checkpoint(location, newest)
        except OSError as exc:  # replaced by a newer one meanwhile
            if not is_not_found(exc) or attempt == LOAD_ATTEMPTS - 1:
                raise
    return None


def batch_owner(location: sfs.Location, batch_id: int) -> str | None:
    """The owner recorded for a committed batch (its manifest, else the checkpoint's)."""
    try:
        owner = read_manifest(location, f"{COMMITS_DIR}/{manifest_name(batch_id)}").get("owner")
        return None if owner is None else str(owner)
    except OSError as exc:
        if not is_not_found(exc):
            raise
    doc = newest_checkpoint(location)
    if doc is None or batch_id > int(doc["batch_id"]):
        return None
    owner = doc.get("owner")
    return None if owner is None else str(owner)


def _live(entry: Mapping[str, Any]) -> LiveFile:
    return LiveFile(
        path=entry["final"],
        rows=int(entry["rows"]),
        size_bytes=int(entry["size_bytes"]),
        partition_values=dict(entry.get("partition_values", {})),
    )


def complete_manifest(location: sfs.Location, rel: str) -> None:
    """Publish every file of a manifest that is not published yet, then mark it done.

    Idempotent: run again after a crash at any point, it finishes the same work.
    """
    manifest = read_manifest(location, rel)
    for entry in manifest["files"]:
        final = location.join(entry["final"])
        if sfs.exists(location, final):
            continue
        staged = location.join(entry["staged"])
        try:
            sfs.move(location, staged, final)
        except OSError:
            # Another process (a restarted driver, a compactor) may have published it first.
            if sfs.exists(location, final):
                continue
            if not sfs.exists(location, staged):
                raise SinkError(
                    f"{location.uri}: {rel} lists {entry['staged']} but it is gone and "
                    f"{entry['final']} was never published"
                ) from None
            raise
    if not location.is_s3:
        for directory in {location.join(e["final"]).rsplit("/", 1)[0] for e in manifest["files"]}:
            sfs.fsync_dir(directory)
    done = location.join(rel.removesuffix(".json") + ".done")
    sfs.write_bytes(location, done, json.dumps({"done_at": time.time()}).encode())


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
    """Probe the location with a create-if-absent write and a delete; :class:`SinkError` if not."""
    secrets = (location.s3.secret_access_key, location.s3.session_token) if location.s3 else ()
    fs = location.filesystem
    try:
        if location.is_s3:
            info = fs.get_file_info(location.bucket)
            if info.type == pafs.FileType.NotFound:
                raise SinkError(f"{location.uri}: bucket {location.bucket!r} does not exist")
        else:
            fs.create_dir(location.join(COMMITS_DIR), recursive=True)
        probe = location.join(META_DIR, f"probe-{uuid.uuid4().hex}")
        sfs.put_if_absent(location, probe, b"probe")
        sfs.delete_quietly(location, probe)
    except SinkError as exc:
        raise SinkError(sfs.describe_error(exc, secrets)) from None
    except PermissionError as exc:
        raise SinkError(f"{location.uri} is not writable: {exc.strerror}") from None
    except OSError as exc:
        raise SinkError(
            f"{location.uri} is not usable: {_s3_reason(sfs.describe_error(exc, secrets))}"
        ) from None


def _s3_reason(message: str) -> str:
    lowered = message.lower()
    if "access_denied" in lowered or "accessdenied" in lowered or "invalidaccesskeyid" in lowered:
        return "access denied (check the access key id and secret access key)"
    if "signaturedoesnotmatch" in lowered or "signature" in lowered:
        return "request signature rejected (check the secret access key)"
    if "nosuchbucket" in lowered:
        return "bucket does not exist"
    return message


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


def file_batch_id(path: str) -> int | None:
    """The batch id in a published file's name (``part-<batch_id:010d>-...``), else ``None``."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith("part-") and name[5:15].isdigit():
        return int(name[5:15])
    return None


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
            files[entry["final"]] = _live(entry)
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
