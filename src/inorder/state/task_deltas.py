"""State format 3: one delta file per task and batch, holding every partition the task committed.

Under the checkpoint's ``state/`` directory::

    _deltas/<version:020d>.<attempt>.arrow    the deltas of one task's partitions in a batch

With one delta file per topic-partition and batch (format 2), a running pipeline at 1,000
sites spent about 45% of its engine tasks' time on the file system: creating, renaming,
syncing, listing and deleting those files (docs/benchmarks.md). A task file holds the same
rows, partition after partition (each partition's upserts, then its tombstones), in one
Arrow IPC file whose buffers Arrow compresses with zstd: its footer, which holds the index,
reads without the rest. The index (the schema's ``inorder.index`` metadata) names each
partition's slice, its meta (the format 2 file's ``meta``) and ``keep_from``: the oldest
version a re-run or rebuild of that partition may still read, as of that batch.

Snapshots stay one file per partition (format 2's names), written every
``snapshot_interval`` deltas as before. A partition's versions are its own directory's files
and its slices of the task files (:meth:`TaskFiles.entries`); a checkpoint may hold both
(format 2 deltas before the switch, task files after), chained by version as ever.

A task file goes when no partition in it can need it: every partition it holds has a newer
slice, in a file of a committed batch, whose ``keep_from`` is past the file's version
(:meth:`TaskFiles.unneeded`). A partition that stops appearing (its topic gone) keeps the
files holding its last slices, as format 2 kept its last files.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as paipc

from inorder.records import TopicPartition
from inorder.state.file_schema import META_KEY, VersionFile, damaged_file
from inorder.storage.fs import Location, list_names

#: The directory of task files, under the checkpoint's ``state/``.
DELTAS_DIR = "_deltas"
#: The index's key in a task file's schema metadata.
INDEX_KEY = b"inorder.index"
_NAME = re.compile(r"^(-?\d{19,20})\.([0-9a-f]{12})\.arrow$")
# Arrow's own compression, per buffer: a task file holds thousands of partitions' rows in ten
# columns, so its codec's fixed cost is paid a few times per file (format 2 compressed each
# small file whole because per buffer it was paid per partition).
_IPC_OPTIONS = paipc.IpcWriteOptions(compression="zstd", use_threads=False)


@dataclass(frozen=True, slots=True)
class PartSlice:
    """One partition's rows in a task file."""

    start: int
    rows: int
    #: The partition's meta after the batch (the ``meta`` of a format 2 delta's metadata).
    meta: dict[str, Any]
    #: Versions older than this are not read by this partition's re-run or rebuild.
    keep_from: int


@dataclass(frozen=True, slots=True)
class TaskIndex:
    """What a task file holds: its batch, the state epoch, and each partition's slice."""

    version: int
    epoch: str
    parts: dict[tuple[str, int], PartSlice]


@dataclass(frozen=True, slots=True)
class TaskFile:
    """One task file as listed."""

    version: int
    attempt: str
    path: str


def task_file_name(version: int, attempt: str) -> str:
    """The name of the task file of batch ``version`` written by ``attempt``."""
    return f"{version:020d}.{attempt}.arrow"


def encode_task_file(table: pa.Table, epoch: str, version: int, parts: list[Any]) -> bytes:
    """The bytes of a task file: ``table`` (every partition's rows, in the order of ``parts``),
    with the index of ``parts``: ``[topic, partition, start, rows, meta, keep_from]`` each."""
    index = {"version": version, "epoch": epoch, "parts": parts}
    table = table.replace_schema_metadata({INDEX_KEY: json.dumps(index).encode()})
    out = pa.BufferOutputStream()
    with paipc.new_file(out, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    data: bytes = out.getvalue().to_pybytes()
    return data


def _decode_index(raw: bytes) -> TaskIndex:
    doc = json.loads(raw)
    parts = {
        (topic, int(partition)): PartSlice(int(start), int(rows), meta, int(keep_from))
        for topic, partition, start, rows, meta, keep_from in doc["parts"]
    }
    return TaskIndex(int(doc["version"]), str(doc["epoch"]), parts)


#: Bytes of decoded task files a process keeps. Partitions rebuilding together (a task on a
#: new executor) read the same 20-40 files, one slice each: decoded once, not once a partition.
TABLE_CACHE_BYTES = 256 << 20
#: Partition slices held in the indexes a process keeps (a few hundred bytes each). A task
#: reads the index of every task file still listed at each batch; those of the files a
#: checkpoint holds at 4,800 topic-partitions (about 200,000 slices) stay cached.
INDEX_CACHE_PARTS = 400_000


class _Cache:
    """Per process: task files' indexes (files never change: each is named by its attempt)
    and the newest decoded files up to :data:`TABLE_CACHE_BYTES`.

    What a listing of a directory no longer shows (deleted files) is dropped at that listing
    (:meth:`keep_listed`): without it, the indexes of every file a long run had written and
    deleted stayed until the count bound, 0.5 MB a batch at 1,000 topic-partitions.
    """

    def __init__(self, parts: int = INDEX_CACHE_PARTS) -> None:
        self._lock = threading.Lock()
        self._indexes: OrderedDict[str, TaskIndex] = OrderedDict()
        self._index_parts = 0
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()
        self._table_bytes = 0
        self._limit = parts

    def keep_listed(self, directory: str, listed: set[str]) -> None:
        """Forget the cached files of ``directory`` that are not in ``listed`` (its files
        as listed now: the others were deleted, and a name is never written again)."""
        prefix = directory.rstrip("/") + "/"

        def gone(path: str) -> bool:
            return path.startswith(prefix) and "/" not in path[len(prefix) :] and path not in listed

        with self._lock:
            for path in [p for p in self._indexes if gone(p)]:
                self._index_parts -= len(self._indexes.pop(path).parts)
            for path in [p for p in self._tables if gone(p)]:
                self._table_bytes -= self._tables.pop(path).nbytes

    def index(self, location: Location, path: str) -> TaskIndex:
        with self._lock:
            found = self._indexes.get(path)
        if found is not None:
            return found
        with location.filesystem.open_input_file(path) as source:
            schema = paipc.open_file(source).schema
        raw = (schema.metadata or {}).get(INDEX_KEY)
        if raw is None:
            raise pa.ArrowInvalid("no index in its metadata")
        index = _decode_index(raw)
        with self._lock:
            if path not in self._indexes:
                self._indexes[path] = index
                self._index_parts += len(index.parts)
            while self._index_parts > self._limit and len(self._indexes) > 1:
                self._index_parts -= len(self._indexes.popitem(last=False)[1].parts)
        return index

    def table(self, location: Location, path: str) -> pa.Table:
        with self._lock:
            found = self._tables.get(path)
        if found is not None:
            return found
        with location.filesystem.open_input_file(path) as source:
            table = paipc.open_file(source).read_all()
        # As format 2: IPC carries no checksum, so a damaged file must fail here, by name.
        table.validate(full=True)
        with self._lock:
            if path not in self._tables and table.nbytes <= TABLE_CACHE_BYTES:
                self._tables[path] = table
                self._table_bytes += table.nbytes
            while self._table_bytes > TABLE_CACHE_BYTES:
                self._table_bytes -= self._tables.popitem(last=False)[1].nbytes
        return table


_CACHE = _Cache()


def read_index(location: Location, path: str) -> TaskIndex:
    """The index of the task file at ``path``; a damaged one is a named
    :class:`~inorder.errors.StorageError`."""
    try:
        return _CACHE.index(location, path)
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as exc:
        raise damaged_file(path, exc) from None


def read_slice(location: Location, path: str, part: tuple[str, int]) -> pa.Table:
    """The rows of ``part`` in the task file at ``path``, with the metadata a format 2 delta
    of that partition and batch carries (``version``, ``epoch``, ``meta``)."""
    index = _CACHE.index(location, path)
    entry = index.parts[part]
    rows = _CACHE.table(location, path).slice(entry.start, entry.rows)
    doc = {"version": index.version, "epoch": index.epoch, "meta": entry.meta}
    return rows.replace_schema_metadata({META_KEY: json.dumps(doc).encode()})


class TaskFiles:
    """The task files of one checkpoint as listed once (a task lists them at its first
    partition's open and asks for each of its partitions)."""

    def __init__(self, location: Location, directory: str) -> None:
        self.location = location
        self.files: list[TaskFile] = []
        names = list_names(location, directory)
        for name, path in names:
            m = _NAME.match(name)
            if m is not None:
                self.files.append(TaskFile(int(m.group(1)), m.group(2), path))
        self.files.sort(key=lambda f: (f.version, f.attempt))
        _CACHE.keep_listed(directory, {path for _, path in names})
        self._indexed: list[tuple[TaskFile, dict[tuple[str, int], PartSlice]]] | None = None

    def index(self, file: TaskFile) -> TaskIndex:
        """The index of ``file``."""
        return read_index(self.location, file.path)

    def _parts(self) -> list[tuple[TaskFile, dict[tuple[str, int], PartSlice]]]:
        # Asked once per partition of the task: the process's cache (a lock and a lookup)
        # once per file instead (about 1 us a file and partition at 140 files).
        if self._indexed is None:
            indexed = []
            for f in list(self.files):
                try:
                    indexed.append((f, self.index(f).parts))
                except FileNotFoundError:
                    # Deleted since the listing by another task of this batch: a stale
                    # attempt's file or one no partition needs (either way, not one to read).
                    self.files.remove(f)
            self._indexed = indexed
        return self._indexed

    def entries(self, tp: TopicPartition) -> list[VersionFile]:
        """``tp``'s versions in task files, oldest first."""
        part = (tp.topic, tp.partition)
        return [
            VersionFile(f.version, "delta", f.path, f.attempt, part)
            for f, parts in self._parts()
            if part in parts
        ]

    def unneeded(self, batch_id: int, keep: dict[tuple[str, int], int]) -> list[str]:
        """Task files of batches before ``batch_id`` that no partition can read any more,
        among those whose first partition is in ``keep`` (this task's: each task looks after
        its own files, and asks about the others' only when partitions moved between tasks).

        ``keep`` holds ``keep_from`` of partitions committed by this batch's task (this
        attempt's snapshots included: the rule itself keeps what a re-run of it reads); the
        others' come from their newest slice in a file of a batch before ``batch_id``
        (committed batches: the batch running now is the only one that may not be).
        """
        committed = [(f, parts) for f, parts in self._parts() if f.version < batch_id]
        newest: dict[tuple[str, int], int] | None = None
        gone: list[str] = []
        for f, parts in committed:
            if not parts or next(iter(parts)) not in keep:
                continue
            for part in parts:  # the first partition still needing it ends the look
                found = keep.get(part)
                if found is None:
                    if newest is None:
                        newest = {}
                        for _, older in reversed(committed):
                            for other, entry in older.items():
                                newest.setdefault(other, entry.keep_from)
                    found = newest.get(part, -1)
                if found <= f.version:
                    break
            else:
                gone.append(f.path)
        return gone
