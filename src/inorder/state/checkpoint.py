"""The engine's files in the checkpoint location (local disk, NFS or S3, through pyarrow.fs).

Layout under the checkpoint root::

    state/_meta.json                                  format, epoch id, state type fingerprint
    state/_deltas/<version:020d>.<attempt>.arrow      keys changed then, one task's partitions
    state/<topic>/<partition>/<version:020d>.delta[.<attempt>].arrow.zstd    the same, one's
    state/<topic>/<partition>/<version:020d>.snapshot[.<attempt>].arrow.zstd all keys after it
    batches/<batch_id:020d>.json                      the batch's processing time
    batches/upto-<batch_id:020d>.parquet              processing times of batches <= that id

Deltas are task files (format 3, :mod:`inorder.state.task_deltas`) or, with
``delta_files = "partition"``, a file per partition. State files are Arrow IPC files (format
2); those of format 1 (``.parquet``, the same schema
and metadata) are read forever, and a partition may hold both: a file's encoding is its own,
the versions chain across them, and old files go as every file goes, by version (see
``docs/state.md``).

A version is a micro-batch id. Files are written whole and appear atomically (temp file +
rename locally, a single PUT on S3), so a reader never sees half a file; rewriting a version
replaces it with identical content (batches are deterministic).

Batch records are merged so that their number stays bounded: every
:data:`BATCH_RECORDS_MERGE` batches the driver writes one ``upto-<C>.parquet`` holding every
processing time up to batch ``C`` (the previous merged file plus the single records), then
deletes the single records and merged files it covers. A crash in between leaves records
present twice with the same values; readers (:meth:`CheckpointStore.batch_times`) take both.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as paipc
import pyarrow.parquet as pq

from inorder.errors import ConfigError, StorageError
from inorder.records import TopicPartition

# Re-exported: they were defined here before, and are imported from here.
from inorder.state.file_schema import META_KEY as META_KEY
from inorder.state.file_schema import STATE_FILE_SCHEMA as STATE_FILE_SCHEMA
from inorder.state.file_schema import VersionFile as VersionFile
from inorder.state.file_schema import damaged_file
from inorder.state.file_schema import file_meta as file_meta
from inorder.state.task_deltas import (
    DELTAS_DIR,
    TaskFiles,
    encode_task_file,
    read_slice,
    task_file_name,
)
from inorder.storage.fs import (
    Location,
    delete_quietly,
    list_files,
    list_names,
    read_bytes,
    read_bytes_if_exists,
    resolve,
    write_bytes,
)
from inorder.storage.group_sync import make_durable, write_unsynced

#: The state directory's format (``state/_meta.json``): a release refuses a newer one. A
#: release that changes how state files are named or encoded raises it, so that an earlier
#: release stops with a named error instead of missing those files. 1: Parquet state files;
#: 2: Arrow IPC files, each compressed whole with zstd (Parquet ones still read).
STATE_FORMAT = 3
#: The format a checkpoint is given unless its pipeline writes task files (format 3,
#: ``StateOptions.delta_files = "task"``): format 2 releases still resume it.
WRITTEN_FORMAT = 2
#: ``<version>.<kind>[.<attempt>].<arrow.zstd|parquet>``: files written before attempts were
#: named have none; ``.parquet`` is format 1's encoding, ``.arrow.zstd`` format 2's.
_FILE = re.compile(r"^(-?\d{19,20})\.(delta|snapshot)(?:\.([0-9a-f]{12}))?\.(arrow\.zstd|parquet)$")
#: The name ending of a state file of format 2. Not ``.zst``: pyarrow's filesystems decompress a
#: file named so when they open it (``compression="detect"``), which every reader would have
#: to turn off.
IPC_SUFFIX = ".arrow.zstd"
_MERGED = re.compile(r"^upto-(\d{20})\.parquet$")
#: State files larger than this are decoded with Arrow's threads (snapshots of many keys).
_THREADED_READ_BYTES = 1 << 20
#: Single batch records are merged every this many batches (the newest ones stay single).
BATCH_RECORDS_MERGE = 100
#: The IPC file is written uncompressed and then compressed whole, as one zstd stream: IPC's
#: own compression pays a codec's fixed cost per column buffer (297 us CPU to encode and 369
#: to decode a delta of 40 keys, against 12 and 31 uncompressed), the whole file's stream
#: about 15 and 30 us more than uncompressed, for a quarter of the bytes (1.5 kB against 6.1
#: kB; Parquet zstd's 3.1 kB). Measured with ``bench/state_encoding.py`` (docs/state.md).
_IPC_OPTIONS = paipc.IpcWriteOptions(compression=None, use_threads=False)


def parse_version_file(name: str, path: str) -> VersionFile | None:
    """The version file named ``name`` (at ``path``), or ``None`` for any other file."""
    parsed = _parse_name(name)
    if parsed is None:
        return None
    return VersionFile(parsed[0], parsed[1], path, parsed[2])


# A partition's 20-40 names are parsed again at every open, one new name per batch: the
# match cost ~2 us a name, two thirds of listing a partition's versions (measured).
@functools.lru_cache(maxsize=1 << 16)
def _parse_name(name: str) -> tuple[int, str, str] | None:
    m = _FILE.match(name)
    return None if m is None else (int(m.group(1)), m.group(2), m.group(3) or "")


def encode_state_file(table: pa.Table) -> bytes:
    """A state table as the bytes of a zstd-compressed Arrow IPC file (format 2), its schema
    metadata kept."""
    ipc = pa.BufferOutputStream()
    with paipc.new_file(ipc, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    # One zstd frame, as the compressed stream wrote before: a codec made once per process
    # instead of a stream per file (about a third of a small delta's encoding, measured).
    data: bytes = _zstd().compress(ipc.getvalue(), asbytes=True)
    return data


@functools.cache
def _zstd() -> pa.Codec:
    return pa.Codec("zstd")


def decode_state_file(path: str, data: bytes) -> pa.Table:
    """The table in a state file's bytes, by the encoding its name says (``.arrow.zstd`` or
    ``.parquet``); ``pa.ArrowInvalid`` or ``OSError`` when they are not a whole file of that
    encoding."""
    threads = len(data) > _THREADED_READ_BYTES
    if path.endswith(IPC_SUFFIX):
        raw = pa.CompressedInputStream(pa.BufferReader(data), "zstd").read()
        options = paipc.IpcReadOptions(use_threads=threads)
        table: pa.Table = paipc.open_file(pa.BufferReader(raw), options=options).read_all()
        # IPC files carry no checksum and Arrow checks only their structure's sizes when
        # reading: damaged offsets or text must be a named error, never garbage (or a crash)
        # in to_pylist. A full validation costs a few microseconds for a delta.
        table.validate(full=True)
        return table
    parquet = pq.ParquetFile(pa.BufferReader(data))
    read: pa.Table = parquet.read(use_threads=threads)
    return read


class CheckpointStore:
    """Reads and writes the engine's files under one checkpoint root.

    Picklable: it keeps the location string and options and resolves the filesystem lazily
    (on the driver and again in each executor process).
    """

    def __init__(self, root: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.root = str(root)
        self.storage_options = dict(storage_options or {})
        self._location: Location | None = None
        #: Inside :meth:`durable_together`: the state files written, the deletions waiting.
        self._written: list[str] | None = None
        self._deferred: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root = state["root"]
        self.storage_options = state["storage_options"]
        self._location = None
        self._written = None
        self._deferred = []

    @property
    def location(self) -> Location:
        """The resolved filesystem location."""
        if self._location is None:
            try:
                self._location = resolve(self.root, self.storage_options or None)
            except StorageError as exc:
                raise ConfigError(f"checkpoint: {exc}") from None
        return self._location

    def path(self, *parts: str) -> str:
        """A path inside the checkpoint root."""
        return self.location.join(*parts)

    def partition_dir(self, tp: TopicPartition) -> str:
        """The directory of one topic-partition's state files."""
        return self.path("state", tp.topic, str(tp.partition))

    # -- small JSON documents ----------------------------------------------------------------

    def read_json(self, *parts: str) -> dict[str, Any] | None:
        """A JSON document, or ``None`` when absent."""
        data = read_bytes_if_exists(self.location, self.path(*parts))
        if data is None:
            return None
        loaded: dict[str, Any] = json.loads(data)
        return loaded

    def write_json(self, document: dict[str, Any], *parts: str) -> None:
        """Write a JSON document atomically."""
        data = json.dumps(document, sort_keys=True).encode()
        write_bytes(self.location, self.path(*parts), data)

    def state_meta(self) -> dict[str, Any] | None:
        """The state directory's metadata (epoch, fingerprint), if created.

        A state directory of a newer format than :data:`STATE_FORMAT` is refused with a named
        error: its files may be named or encoded in ways this release does not see, and
        reading on would start partitions from empty state without a word.
        """
        meta = self.read_json("state", "_meta.json")
        found = (meta or {}).get("format", 1)
        if not isinstance(found, int) or found > STATE_FORMAT:
            raise ConfigError(
                f"checkpoint {self.root}: its state is of format {found!r} "
                f"({self.path('state', '_meta.json')}), written by a newer release of inorder; "
                f"this release reads format {STATE_FORMAT} and earlier: run the newer release"
            )
        return meta

    def init_state_meta(
        self, fingerprint: dict[str, Any], state_format: int = WRITTEN_FORMAT
    ) -> dict[str, Any]:
        """Create the state metadata (new epoch id, ``state_format``) and return it."""
        meta = {"format": state_format, "epoch": uuid.uuid4().hex, "fingerprint": fingerprint}
        self.write_json(meta, "state", "_meta.json")
        return meta

    def adopt_state_meta(
        self, meta: dict[str, Any], state_format: int = WRITTEN_FORMAT
    ) -> dict[str, Any]:
        """``meta`` (from :meth:`state_meta`) raised to ``state_format``, written if it was
        older; everything else in it (epoch, fingerprint) kept.

        Called before this release writes its first state file into a checkpoint an earlier
        format made: from then on, a release of that format refuses the directory by name
        instead of missing the files it cannot read (and starting partitions empty).
        """
        if meta.get("format", 1) >= state_format:
            return meta
        adopted = {**meta, "format": state_format}
        self.write_json(adopted, "state", "_meta.json")
        return adopted

    def batch_time_us(self, batch_id: int) -> int:
        """The processing time of ``batch_id``: recorded at its first run, reused on re-runs."""
        name = f"{batch_id:020d}.json"
        found = self.read_json("batches", name)
        if found is not None:
            return int(found["processing_time_us"])
        merged_upto, merged_path = self._merged_batch_file()
        if merged_path is not None and batch_id <= merged_upto:
            known = self._read_merged(merged_path).get(batch_id)
            if known is not None:
                return known
        now = time.time_ns() // 1000
        self.write_json({"batch_id": batch_id, "processing_time_us": now}, "batches", name)
        n = BATCH_RECORDS_MERGE
        if batch_id % n == 0 and batch_id >= 2 * n:
            self.merge_batch_times(batch_id - n)
        return now

    def _merged_batch_file(self) -> tuple[int, str | None]:
        """The newest merged batch-record file: (last batch it holds, path)."""
        best: tuple[int, str | None] = (-1, None)
        for info in list_files(self.location, self.path("batches")):
            m = _MERGED.match(info.base_name)
            if m and int(m.group(1)) > best[0]:
                best = (int(m.group(1)), info.path)
        return best

    def _read_merged(self, path: str) -> dict[int, int]:
        table = pq.read_table(io.BytesIO(read_bytes(self.location, path)))
        ids = table.column("batch_id").to_pylist()
        times = table.column("processing_time_us").to_pylist()
        return dict(zip(ids, times, strict=True))

    def batch_times(self, wanted: Iterable[int] | None = None) -> dict[int, int]:
        """Recorded processing times (of the ``wanted`` batch ids only, if given)."""
        keep = None if wanted is None else set(wanted)
        for attempt in range(3):
            try:
                return self._batch_times(keep)
            except OSError as exc:  # a merge deleted what was listed: list again
                text = str(exc).lower()
                missing = isinstance(exc, FileNotFoundError) or "not found" in text
                if not missing or attempt == 2:
                    raise
        return {}

    def _batch_times(self, keep: set[int] | None) -> dict[int, int]:
        times: dict[int, int] = {}
        _, merged_path = self._merged_batch_file()
        if merged_path is not None:
            for bid, us in self._read_merged(merged_path).items():
                if keep is None or bid in keep:
                    times[bid] = us
        for info in list_files(self.location, self.path("batches")):
            stem = info.base_name.removesuffix(".json")
            if stem == info.base_name or not stem.lstrip("-").isdigit():
                continue
            bid = int(stem)
            if bid in times or (keep is not None and bid not in keep):
                continue
            doc = json.loads(read_bytes(self.location, info.path))
            times[bid] = int(doc["processing_time_us"])
        return times

    def merge_batch_times(self, upto: int) -> None:
        """Merge every batch record up to ``upto`` into one file, then delete what it covers."""
        merged_upto, merged_path = self._merged_batch_file()
        if upto <= merged_upto:
            return
        times = self._read_merged(merged_path) if merged_path is not None else {}
        singles: list[str] = []
        for info in list_files(self.location, self.path("batches")):
            stem = info.base_name.removesuffix(".json")
            if stem != info.base_name and stem.lstrip("-").isdigit() and int(stem) <= upto:
                doc = json.loads(read_bytes(self.location, info.path))
                times[int(stem)] = int(doc["processing_time_us"])
                singles.append(info.path)
        ids = sorted(times)
        table = pa.table(
            {
                "batch_id": pa.array(ids, pa.int64()),
                "processing_time_us": pa.array([times[i] for i in ids], pa.int64()),
            }
        )
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        write_bytes(
            self.location, self.path("batches", f"upto-{upto:020d}.parquet"), buffer.getvalue()
        )
        # Only once the merged file exists: what it covers may go.
        for path in singles:
            delete_quietly(self.location, path)
        for info in list_files(self.location, self.path("batches")):
            m = _MERGED.match(info.base_name)
            if m and int(m.group(1)) < upto:
                delete_quietly(self.location, info.path)

    # -- versioned state files ---------------------------------------------------------------

    def task_files(self) -> TaskFiles:
        """The task files (state format 3) as they are now."""
        return TaskFiles(self.location, self.path("state", DELTAS_DIR))

    def versions(self, tp: TopicPartition, listed: TaskFiles | None = None) -> list[VersionFile]:
        """All delta and snapshot files of ``tp``, by version (delta before snapshot), its
        slices of task files included (from ``listed``, else listed now)."""
        found = (listed or self.task_files()).entries(tp)
        directory = self.partition_dir(tp)
        for name, path in list_names(self.location, directory):
            file = parse_version_file(name, path)
            if file is not None:
                found.append(file)
        found.sort(key=lambda f: (f.version, f.kind != "delta"))
        return found

    def file_path(self, tp: TopicPartition, version: int, kind: str, attempt: str = "") -> str:
        """Where version ``version`` of kind ``kind`` written by ``attempt`` lives (written
        now: this release's encoding)."""
        named = f".{attempt}" if attempt else ""
        return f"{self.partition_dir(tp)}/{version:020d}.{kind}{named}{IPC_SUFFIX}"

    def write_table(
        self, tp: TopicPartition, version: int, kind: str, table: pa.Table, attempt: str = ""
    ) -> int:
        """Write a delta or snapshot file atomically; returns its size in bytes.

        The checkpoint's ``_meta.json`` must say :data:`STATE_FORMAT` already
        (:meth:`init_state_meta`, :meth:`adopt_state_meta`: the driver's check does it).
        """
        # An Arrow IPC file, not Parquet: state files are small and always read whole, and
        # Parquet's writer and footer cost ~0.3-1 ms per file, 10-30 times the IPC file's.
        return self._write_state(
            self.file_path(tp, version, kind, attempt), encode_state_file(table)
        )

    def write_task_file(
        self, version: int, epoch: str, table: pa.Table, parts: list[Any]
    ) -> tuple[str, int]:
        """Write a task's delta file of batch ``version`` (state format 3: ``table`` holds the
        rows of ``parts``, see :func:`~inorder.state.task_deltas.encode_task_file`); returns
        its attempt and its size in bytes."""
        attempt = os.urandom(6).hex()
        path = self.path("state", DELTAS_DIR, task_file_name(version, attempt))
        return attempt, self._write_state(path, encode_task_file(table, epoch, version, parts))

    def _write_state(self, path: str, data: bytes) -> int:
        try:
            if self._written is None:
                write_bytes(self.location, path, data)
            else:
                write_unsynced(path, data)
                self._written.append(path)
        except OSError as exc:
            # A full disk or a lost mount: say which state file and that nothing was committed.
            reason = exc.strerror or str(exc).strip().splitlines()[0] or type(exc).__name__
            raise StorageError(
                f"cannot write state file {path}: {reason}; the batch was not committed: run "
                "again once the checkpoint location is writable"
            ) from None
        return len(data)

    @contextlib.contextmanager
    def durable_together(self) -> Iterator[None]:
        """State files written inside are made durable together when it ends.

        Locally, each file is written without its own fsyncs and one sync makes them all
        durable at the end (:mod:`inorder.storage.group_sync`); deletions wait until after
        it, so no file a committed batch needs is deleted before the files that replace it
        are durable. If the block raises, nothing is synced and nothing deleted (the
        batch fails; the next attempt writes its files again). On S3 a PUT is durable when
        it returns: nothing changes there.
        """
        if self._written is not None or self.location.is_s3:
            yield
            return
        self._written, self._deferred = [], []
        try:
            yield
            written, deferred = self._written, self._deferred
        finally:
            self._written, self._deferred = None, []
        make_durable(written)
        for path in deferred:
            delete_quietly(self.location, path)

    def read_version(self, file: VersionFile) -> pa.Table:
        """Read a version: a state file, or a partition's slice of a task file."""
        if file.part is None:
            return self.read_table(file.path)
        try:
            return read_slice(self.location, file.path, file.part)
        except FileNotFoundError:
            raise
        except (pa.ArrowInvalid, OSError, KeyError, ValueError) as exc:
            raise damaged_file(file.path, exc) from None

    def read_table(self, path: str) -> pa.Table:
        """Read a state file; a damaged one is a named :class:`StorageError`, never skipped."""
        try:
            # Read whole, then decoded from memory: ``pq.read_table`` goes through the
            # dataset layer, whose fixed cost was two thirds of reading a small delta (most
            # state files are a few kB, and a moved partition reads one per batch it missed).
            with self.location.filesystem.open_input_stream(path) as stream:
                data = stream.read()
            table = decode_state_file(path, data)
        except FileNotFoundError:
            raise
        except (pa.ArrowInvalid, OSError) as exc:
            # Without this the run stopped with "An exception was thrown from the Python
            # worker" and nothing naming the file (pyarrow's error is no inorder error).
            raise damaged_file(path, exc) from None
        return table

    def delete(self, path: str) -> None:
        """Delete a file if present (inside :meth:`durable_together`: when it ends)."""
        if self._written is not None:
            self._deferred.append(path)
            return
        delete_quietly(self.location, path)

    def is_local(self) -> bool:
        """Whether the checkpoint is on a local (or NFS-mounted) filesystem."""
        return isinstance(self.location.filesystem, pafs.LocalFileSystem)

    def local_root(self) -> str | None:
        """The checkpoint's absolute local path, when local."""
        return os.path.abspath(self.location.root) if self.is_local() else None
