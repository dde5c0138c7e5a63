"""Versioned, incremental state of one topic-partition: checkpoint files + a verified local cache.

Batch ``B`` of a topic-partition:

1. :meth:`PartitionStore.open` finds the newest version ``V < B`` in the checkpoint, in the
   partition's own files and its slices of task files (state format 3); files at or above
   ``B`` come from an attempt that was never committed: they are deleted. Each file
   is named by the attempt that wrote it. If the local cache holds exactly ``V`` of this
   checkpoint (same epoch, same attempt) it is used as is: a cache moved to ``V`` by an
   attempt whose commit failed, when ``V`` was then re-run with other settings, holds other
   content and is not. If it holds an older version ``C`` whose file is still in the checkpoint,
   the deltas after ``C`` up to ``V`` are applied to it (the same files a rebuild would end
   with); otherwise it is rebuilt from the newest snapshot ``<= V`` plus the deltas after it.
   The cache is a view of one database per worker process (:mod:`inorder.state.registry`),
   open between batches; a partition whose task moves to another process uses that
   process's view, brought up to date the same way (from deltas when it holds a version
   still in the checkpoint), and never opens a database of its own.
2. The engine reads keys through :class:`CacheView` (only touched keys become Python objects).
3. :func:`~inorder.state.store_commit.commit_partitions` writes the delta of ``B`` (changed
   keys: upserts with the state's codec bytes and timer, deletes as tombstones) atomically to
   the checkpoint (in the task's file, or a file of the partition's own), then
   every ``snapshot_interval`` versions (the first a little later: :func:`snapshot_after`)
   a full snapshot, then moves the cache to ``B`` and deletes versions older than both the
   last snapshot minus ``retain_versions`` and the snapshot before it (which a re-run of
   ``B`` reads when ``B``'s commit fails after its tasks).

Writing ``B`` again (a re-run after a crash) writes a file of its own attempt.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from inorder.records import TopicPartition
from inorder.state.cache import LocalCache, Row, entry_row, partition_prefix
from inorder.state.checkpoint import (
    CheckpointStore,
    VersionFile,
    file_meta,
)
from inorder.state.entry import KeyEntry, PartitionMeta
from inorder.state.registry import REGISTRY, HeldCache
from inorder.state.state_table import rows_of_table, table_of_rows
from inorder.state.task_deltas import TaskFiles


@dataclass(frozen=True, slots=True)
class StateOptions:
    """Tuning of the state store.

    ``snapshot_interval``: write a full snapshot after this many deltas (a partition's first
    one after a stable number between all of it and one and a half times it, so that
    partitions do not all write theirs in the same batch: :func:`snapshot_after`).
    ``retain_versions``: keep this many versions before the newest snapshot (for rollback
    tools). ``cache_dir``: where worker caches live (default:
    ``$TMPDIR/inorder-state-cache``). ``keep_open``: how many cache databases a worker
    process keeps open between batches, one per checkpoint it serves, each holding all its
    topic-partitions (least recently used closed first; 0 closes the database after each
    task, so every task opens it again; fewer when the process's open file limit would not
    allow that many, see :mod:`inorder.state.registry`).
    """

    snapshot_interval: int = 20
    retain_versions: int = 20
    cache_dir: str | None = None
    #: Where a batch's deltas go: ``"task"``, one file per task holding all its partitions'
    #: (state format 3, :mod:`inorder.state.task_deltas`; a release before it refuses the
    #: checkpoint), or ``"partition"``, a file per topic-partition (format 2).
    delta_files: str = "task"
    # Opening and closing a RocksDB database costs 30-100 ms; an open one costs up to ~210
    # file descriptors (state/registry.py) and its unflushed writes are bounded per process
    # (state/cache.py). Any value above 0 keeps the process's one database of a checkpoint.
    keep_open: int = 1024


@dataclass(slots=True)
class StoreStats:
    """What opening and committing cost, for the batch report."""

    cache_hit: bool = False
    caught_up: int = 0
    reused_handle: bool = False
    rebuilt_keys: int = 0
    opened_db: bool = False
    load_seconds: float = 0.0
    changed_keys: int = 0
    delta_bytes: int = 0
    snapshot_written: bool = False
    commit_seconds: float = 0.0


class CacheView:
    """The engine's :class:`~inorder.state.entry.StateView` over a local cache."""

    def __init__(self, cache: LocalCache, state_codec: Any) -> None:
        self._cache = cache
        self._decode = state_codec.decode

    def load(self, key: str) -> KeyEntry | None:
        """Decode the entry of ``key``."""
        row = self._cache.get(key)
        if row is None:
            return None
        state_bytes, last_offset, last_ts, kafka_key, seq, timer, timer_kind, ignored = row
        state = None if state_bytes is None else self._decode(state_bytes)
        return KeyEntry(state, last_offset, last_ts, kafka_key, seq, timer, timer_kind, ignored)

    def timers_after(
        self, kind: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str]]:
        """Pending timers, from the cache's index."""
        return self._cache.timers_after(kind, after, limit)


def snapshot_after(tp: TopicPartition, interval: int) -> int:
    """How many deltas ``tp`` writes before its first snapshot: ``interval`` plus a stable
    share of up to half of it, by partition (later snapshots follow every ``interval``).

    Partitions that started together would otherwise all write their snapshots, and delete
    their old versions, in the same batch: measured at 1,200 topic-partitions, every 20th
    batch took twice the median. With phases of their own they spread over the batches.
    Later, not sooner: the versions before a partition's first snapshot are the ones ops
    tools can rebuild from its first delta, and no partition loses any of them earlier
    than a whole interval in.
    """
    spread = interval // 2
    if spread < 2:
        return interval
    return interval + zlib.crc32(f"{tp.topic}\0{tp.partition}".encode()) % spread


@functools.lru_cache(maxsize=64)  # asked per partition and batch: a digest each time
def cache_base(checkpoint_root: str, options: StateOptions) -> str:
    """The directory of the cache slots of the checkpoint at ``checkpoint_root``."""
    root = options.cache_dir or os.path.join(tempfile.gettempdir(), "inorder-state-cache")
    digest = hashlib.sha1(checkpoint_root.encode()).hexdigest()[:16]
    return os.path.join(root, digest)


def close_task_slot(checkpoint_root: str, options: StateOptions, slot: str) -> None:
    """Close this process's task slot ``slot`` of the checkpoint (:mod:`inorder.state.registry`)."""
    REGISTRY.close_slot(cache_base(checkpoint_root, options), slot)


class PartitionStore:
    """The state of one topic-partition for one batch: open, read, commit, close."""

    def __init__(
        self,
        checkpoint: CheckpointStore,
        tp: TopicPartition,
        state_codec: Any,
        epoch: str,
        options: StateOptions | None = None,
        slot: str | None = None,
        listed: TaskFiles | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        #: The task slot whose cache to use (:mod:`inorder.state.registry`), if any.
        self.slot = slot
        #: The task files as the task listed them (listed at each open when ``None``).
        self.listed = listed
        self._lists_itself = listed is None
        self.tp = tp
        self.state_codec = state_codec
        self.epoch = epoch
        self.options = options or StateOptions()
        self.stats = StoreStats()
        self._cache: LocalCache | None = None
        self._held: HeldCache | None = None
        self._versions: list[VersionFile] = []
        self._batch_id = -1
        self._attempt = ""
        #: Keys the cache held after this store's last write to it (``None``: not written).
        self._keys: int | None = None

    # -- paths -------------------------------------------------------------------------------

    def _cache_base(self) -> str:
        return cache_base(self.checkpoint.root, self.options)

    def _open_cache(self) -> LocalCache:
        # A slot held by another process is not waited for: the next free slot is used; a
        # view in use by another store of this process (a concurrent attempt of the same
        # task) is not shared: that store gets a private cache.
        prefix = partition_prefix(self.tp.topic, self.tp.partition)
        held = REGISTRY.acquire(self._cache_base(), prefix, self.options.keep_open, self.slot)
        self._held = held
        self.stats.reused_handle = held.reused
        self.stats.opened_db = held.opened
        return held.cache

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self, batch_id: int) -> tuple[CacheView, PartitionMeta]:
        """Make the cache hold the state before ``batch_id``; return a view and the meta."""
        started = time.perf_counter()
        self._batch_id = batch_id
        self._keys = None
        if self._lists_itself:
            self.listed = self.checkpoint.task_files()
        versions = self.checkpoint.versions(self.tp, self.listed)
        for f in versions:
            # From attempts of this or later batches that never committed: this attempt
            # writes its own (a re-run after changed settings may write other content). A
            # task file goes whole: all of it is from such an attempt.
            if f.version >= batch_id:
                self.checkpoint.delete(f.path)
        self._versions = [f for f in versions if f.version < batch_id]
        current = self._versions[-1].version if self._versions else -1
        attempt = self._versions[-1].attempt if self._versions else ""
        if self._cache is not None:  # opened again: release the previous handle first
            self._release()
        cache = self._open_cache()
        self._cache = cache
        try:
            header = cache.header()
            have = header.get("version")
            # The cache holds a version's content only if it holds the attempt that wrote
            # the file the checkpoint has now (caches written before attempts: "" both).
            same_epoch = header.get("epoch") == self.epoch
            if same_epoch and have == current and header.get("attempt", "") == attempt:
                self.stats.cache_hit = True
                self._keys = int(header.get("keys", 0))
                meta = PartitionMeta.from_json(header.get("meta") or {})
            elif (
                same_epoch
                and isinstance(have, int)
                and have < current
                and self._has(have, header.get("attempt", ""))
            ):
                try:
                    meta = self._catch_up(cache, have, current, header.get("meta") or {})
                except FileNotFoundError:  # a task file no partition of its own needed
                    meta = self._rebuild(cache, current)
            else:
                meta = self._rebuild(cache, current)
        except BaseException:
            self._discard()
            raise
        self.stats.load_seconds = time.perf_counter() - started
        return CacheView(cache, self.state_codec), meta

    @property
    def batch_id(self) -> int:
        """The batch this store was opened for (-1 before :meth:`open`)."""
        return self._batch_id

    def _has(self, version: int, attempt: str) -> bool:
        # Cleanup deletes the oldest versions and open() the newest ones, so while the
        # cache's own version is still in the checkpoint, every file after it is too.
        return any(f.version == version and f.attempt == attempt for f in self._versions)

    def _catch_up(
        self, cache: LocalCache, have: int, current: int, meta_json: dict[str, Any]
    ) -> PartitionMeta:
        """Apply the deltas after ``have`` (the cache's version) up to ``current``."""
        files = [f for f in self._versions if f.kind == "delta" and have < f.version <= current]
        self.stats.caught_up = len(files)
        return self._apply(cache, files, current, meta_json, fresh=False)

    def _rebuild(self, cache: LocalCache, current: int) -> PartitionMeta:
        cache.clear()
        chain = self._versions
        snapshots = [f for f in chain if f.kind == "snapshot"]
        start = snapshots[-1].version if snapshots else -1
        files = ([snapshots[-1]] if snapshots else []) + [
            f for f in chain if f.kind == "delta" and f.version > start
        ]
        return self._apply(cache, files, current, {}, fresh=True)

    def _apply(
        self,
        cache: LocalCache,
        files: list[VersionFile],
        current: int,
        meta_json: dict[str, Any],
        *,
        fresh: bool,
    ) -> PartitionMeta:
        """Write ``files`` into the cache in order, then mark it as holding ``current``."""
        for f in files:
            table = self.checkpoint.read_version(f)
            upserts, deletes = rows_of_table(table)
            self.stats.rebuilt_keys += len(upserts)
            meta_json = file_meta(table).get("meta", meta_json)
            cache.write(
                upserts,
                deletes,
                {
                    "epoch": self.epoch,
                    "version": f.version,
                    "meta": meta_json,
                    "attempt": f.attempt,
                },
                fresh=fresh,
            )
            fresh = False
        attempt = self._versions[-1].attempt if self._versions else ""
        header = {"epoch": self.epoch, "version": current, "meta": meta_json, "attempt": attempt}
        self._keys = cache.write([], [], header)
        return PartitionMeta.from_json(meta_json)

    def delta_rows(
        self, changes: dict[str, KeyEntry | None]
    ) -> tuple[list[tuple[str, Row]], list[str]]:
        """This batch's changed keys as stored rows (state encoded) and deleted keys."""
        encode = self.state_codec.encode
        upserts: list[tuple[str, Row]] = []
        deletes: list[str] = []
        for key in sorted(changes):
            entry = changes[key]
            if entry is None:
                deletes.append(key)
            else:
                state = None if entry.state is None else encode(entry.state)
                upserts.append((key, entry_row(entry, state)))
        return upserts, deletes

    def write_delta(
        self,
        table: pa.Table,
        upserts: list[tuple[str, Row]],
        deletes: list[str],
        file_meta_doc: dict[str, Any],
    ) -> None:
        """Write this batch's delta ``table`` (its rows ``upserts`` and ``deletes``) as a file
        of this partition, then :meth:`advance`."""
        attempt = os.urandom(6).hex()
        self.stats.delta_bytes = self.checkpoint.write_table(
            self.tp, self._batch_id, "delta", table, attempt
        )
        self.advance(upserts, deletes, file_meta_doc, attempt)

    def advance(
        self,
        upserts: list[tuple[str, Row]],
        deletes: list[str],
        file_meta_doc: dict[str, Any],
        attempt: str,
    ) -> None:
        """Once this batch's delta (written by ``attempt``) is in the checkpoint: move the
        cache to it, and write a snapshot when one is due."""
        assert self._cache is not None, "open() first"
        version = self._batch_id
        self._attempt = attempt
        # The checkpoint is written first: a cache ahead of the checkpoint would be wrong,
        # a cache behind it is merely rebuilt.
        meta_json = file_meta_doc["meta"]
        header = {"epoch": self.epoch, "version": version, "meta": meta_json, "attempt": attempt}
        self._keys = self._cache.write(upserts, deletes, header, keys_before=self._keys)
        if self.snapshot_due():
            self._snapshot(version, file_meta_doc)
            self._cleanup()

    def snapshot_due(self) -> bool:
        """Whether this batch's commit writes a snapshot (every ``snapshot_interval`` deltas;
        the first after :func:`snapshot_after`)."""
        last_snapshot = max((f.version for f in self._versions if f.kind == "snapshot"), default=-1)
        deltas_since = (
            sum(1 for f in self._versions if f.kind == "delta" and f.version > last_snapshot) + 1
        )
        interval = self.options.snapshot_interval
        if last_snapshot < 0:  # the first one sets the partition's phase (then every interval)
            interval = snapshot_after(self.tp, interval)
        return deltas_since >= interval

    def keep_from(self, snapshot_now: bool) -> int:
        """The oldest version this partition's re-run or rebuild may read once this batch
        commits (with a snapshot of it when ``snapshot_now``); -1: every version.

        The batch is not committed yet: if its commit fails, its re-run opens the version
        before it, from the previous snapshot and the deltas after it (all deltas when there
        is none), so those stay whatever ``retain_versions`` says. Deleting by
        ``retain_versions`` alone lost the keys of a partition's first deltas when its first
        snapshot came more than ``retain_versions`` deltas in (:func:`snapshot_after`).
        """
        snapshots = [f.version for f in self._versions if f.kind == "snapshot"]
        if snapshot_now:
            snapshots.append(self._batch_id)
        if len(snapshots) < 2:
            return -1
        return min(snapshots[-1] - self.options.retain_versions, snapshots[-2])

    def _snapshot(self, version: int, meta_doc: dict[str, Any]) -> None:
        assert self._cache is not None
        rows = list(self._cache.rows())
        table = table_of_rows(rows, [], meta_doc)
        self.checkpoint.write_table(self.tp, version, "snapshot", table, self._attempt)
        self.stats.snapshot_written = True

    def _cleanup(self) -> None:
        keep_from = self.keep_from(snapshot_now=True)
        for f in self._versions:
            # Task files hold other partitions too: they go by their own rule (task_deltas).
            if f.version < keep_from and f.part is None:
                self.checkpoint.delete(f.path)

    def key_count(self) -> int:
        """Number of keys held (as counted by the cache)."""
        assert self._cache is not None
        if self._keys is not None:  # the count the last write left: no header to decode
            return self._keys
        return int(self._cache.header().get("keys", 0))

    def close(self) -> None:
        """Release the cache (its database stays open in this process for the next tasks)."""
        self._release()

    def _release(self) -> None:
        if self._held is not None:
            REGISTRY.release(self._held, self.options.keep_open)
        self._held = None
        self._cache = None

    def _discard(self) -> None:
        # A failure while loading leaves the view at some version its header names, which
        # is consistent; it is forgotten anyway rather than trusted to a later task.
        if self._held is not None:
            REGISTRY.discard(self._held, self.options.keep_open)
        self._held = None
        self._cache = None

    def __enter__(self) -> PartitionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
