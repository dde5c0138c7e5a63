"""The per-worker local cache of topic-partitions' state: one RocksDB database (rocksdict).

The checkpoint is the truth; this cache only saves re-reading it every batch. A worker
process holds one database per checkpoint (:class:`CacheDB`, see
:mod:`inorder.state.registry`) with every topic-partition it served, each under a key prefix
of its own (:class:`LocalCache`, a view). A view records the checkpoint epoch and the state
version it holds, and the store uses it only when both match what the checkpoint says is
current (else it is caught up or rebuilt from the checkpoint). Entries and the version change
in one atomic ``WriteBatch``, so a crash never leaves a view claiming a version it does not
hold. State larger than memory lives on local disk; RocksDB keeps only its block cache and
write buffers in memory.

Key layout (raw bytes), each key starting with the view's prefix
``<topic utf-8>\\x00<partition decimal>\\x00`` (topic names never contain ``\\x00``, so no
prefix is the beginning of another's keys):

* ``<prefix>k<key utf-8>`` -> msgpack ``[state, last_offset, last_ts, kafka_key, seq,
  timer, timer_kind, ignored]``
* ``<prefix>t<kind><deadline+2**63 big-endian 8 bytes><key utf-8>`` -> empty: the timer
  index, ordered by (kind, deadline, key) exactly as the engine orders timers
* ``<prefix>m`` -> JSON ``{"epoch", "version", "meta"}``
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import msgspec

from inorder.state.entry import KeyEntry

_ENTRY = b"k"
_TIMER = b"t"
_META = b"m"
_BIAS = 1 << 63

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()

#: A stored entry: the KeyEntry fields with the state as codec bytes.
Row = tuple[bytes | None, int, int | None, bytes | None, int | None, int | None, int, bool]


def timer_key(kind: int, deadline: int, key: str) -> bytes:
    """The index key of a timer (without a view's prefix)."""
    return _TIMER + bytes((kind,)) + (deadline + _BIAS).to_bytes(8, "big") + key.encode()


def partition_prefix(topic: str, partition: int) -> bytes:
    """The key prefix of one topic-partition's view."""
    return topic.encode() + b"\x00" + str(partition).encode() + b"\x00"


#: Memtable size of one database.
_WRITE_BUFFER_BYTES = 16 << 20
#: Block cache shared by all databases of one process.
_BLOCK_CACHE_BYTES = 32 << 20
_shared_block_cache: tuple[int, Any] | None = None
#: Unflushed writes of all databases of one process together (one per checkpoint the process
#: serves); past this limit RocksDB flushes the largest memtables to their files.
_WRITE_BUFFERS_BYTES = 64 << 20
_shared_write_buffers: tuple[int, Any] | None = None
#: Table files one database keeps open (RocksDB keeps all by default): bounds its file
#: descriptors however large the state grows (state/registry.py budgets them).
MAX_OPEN_FILES = 200


def _table_options() -> Any:
    """Table options using this process's shared block cache (made after a fork, not before)."""
    global _shared_block_cache
    from rocksdict import BlockBasedOptions, Cache

    if _shared_block_cache is None or _shared_block_cache[0] != os.getpid():
        _shared_block_cache = (os.getpid(), Cache(_BLOCK_CACHE_BYTES))
    table = BlockBasedOptions()
    table.set_block_cache(_shared_block_cache[1])
    return table


def _write_buffer_manager() -> Any:
    """The write buffer manager shared by this process's databases (made after a fork)."""
    global _shared_write_buffers
    from rocksdict import WriteBufferManager

    if _shared_write_buffers is None or _shared_write_buffers[0] != os.getpid():
        _shared_write_buffers = (os.getpid(), WriteBufferManager(_WRITE_BUFFERS_BYTES, False))
    return _shared_write_buffers[1]


class CacheBusy(Exception):
    """Another process holds this database (RocksDB's own lock)."""


class CacheDB:
    """One RocksDB database at ``path``, holding the views of many topic-partitions."""

    def __init__(self, path: str) -> None:
        from rocksdict import Options, Rdict

        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Every open rotates RocksDB's info log; without a limit old logs pile up per open.
        options.set_keep_log_file_num(2)
        # Bound what the database holds in memory: unflushed writes at most 2 x 16 MiB (and
        # all databases of the process together 64 MiB); read blocks: one LRU cache shared
        # by the process's databases.
        options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
        options.set_max_write_buffer_number(2)
        options.set_write_buffer_manager(_write_buffer_manager())
        options.set_block_based_table_factory(_table_options())
        options.set_max_open_files(MAX_OPEN_FILES)
        try:
            self.db: Any = Rdict(path, options)
        except Exception as exc:
            if "lock" in str(exc).lower():
                raise CacheBusy(str(exc)) from None
            # A damaged cache is not worth diagnosing: it is only a copy of the checkpoint.
            shutil.rmtree(path, ignore_errors=True)
            self.db = Rdict(path, options)

    def close(self) -> None:
        """Release the database (and RocksDB's lock)."""
        self.db.close()

    def view(self, prefix: bytes) -> LocalCache:
        """The view of the topic-partition whose keys start with ``prefix``."""
        return LocalCache(self, prefix)


class LocalCache:
    """One topic-partition's entries in a :class:`CacheDB`, with the version they represent.

    Every key it reads or writes starts with ``prefix``; another view's keys never do.
    """

    def __init__(self, db: CacheDB, prefix: bytes) -> None:
        assert prefix.endswith(b"\x00"), "a prefix ends with its separator"
        self._db = db.db
        self._prefix = prefix
        self._entry = prefix + _ENTRY
        self._meta = prefix + _META

    # -- version -----------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """``{"epoch", "version", "meta"}`` (version -1 and no epoch when empty)."""
        raw = self._db.get(self._meta)
        if raw is None:
            return {"epoch": None, "version": -1, "meta": {}}
        loaded: dict[str, Any] = json.loads(raw)
        return loaded

    def clear(self) -> None:
        """Drop everything of this view (and nothing of another)."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        # Every key of the view starts with the prefix, which ends with \x00: the keys from
        # the prefix up to the same bytes ending with \x01 instead are exactly the view's.
        batch.delete_range(self._prefix, self._prefix[:-1] + b"\x01")
        self._db.write(batch)

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> Row | None:
        """The stored row of ``key``."""
        raw = self._db.get(self._entry + key.encode())
        if raw is None:
            return None
        return tuple(_decoder.decode(raw))

    def timers_after(
        self, kind: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` timers ``(deadline, key)`` of ``kind`` after ``after``, ordered."""
        prefix = self._prefix + _TIMER + bytes((kind,))
        start = prefix if after is None else self._prefix + timer_key(kind, after[0], after[1])
        it = self._db.iter()
        it.seek(start)
        out: list[tuple[int, str]] = []
        plen = len(prefix)
        while it.valid() and len(out) < limit:
            raw = it.key()
            if not raw.startswith(prefix):
                break
            if raw != start or after is None:
                deadline = int.from_bytes(raw[plen : plen + 8], "big") - _BIAS
                out.append((deadline, raw[plen + 8 :].decode()))
            it.next()
        return out

    def rows(self) -> Iterator[tuple[str, Row]]:
        """Every ``(key, row)``, in key order."""
        entry = self._entry
        skip = len(entry)
        it = self._db.iter()
        it.seek(entry)
        while it.valid():
            raw = it.key()
            if not raw.startswith(entry):
                break
            yield raw[skip:].decode(), tuple(_decoder.decode(it.value()))
            it.next()

    # -- writes ------------------------------------------------------------------------------

    def write(
        self,
        upserts: list[tuple[str, Row]],
        deletes: list[str],
        header: dict[str, Any],
        *,
        fresh: bool = False,
        keys_before: int | None = None,
    ) -> int:
        """Apply changes and set the header, atomically; the number of keys held after.

        Removes the timer index entries of replaced or deleted keys (``fresh``: the view is
        known to be empty, skip those reads). ``keys_before``: the number of keys the view
        holds now, when the caller knows it (else it is read from the header).
        """
        from rocksdict import WriteBatch

        db = self._db
        entry = self._entry
        prefix = self._prefix
        batch = WriteBatch(raw_mode=True)
        if fresh:
            keys = 0
        elif keys_before is not None:
            keys = keys_before
        else:
            keys = int(self.header().get("keys", 0))
        if fresh:
            keys += len(upserts)
        else:
            upserted = {k for k, _ in upserts}
            for key in (*upserted, *deletes):
                old = db.get(entry + key.encode())
                if old is None:
                    keys += 1 if key in upserted else 0
                    continue
                if key not in upserted:
                    keys -= 1
                row = _decoder.decode(old)
                if row[5] is not None:
                    batch.delete(prefix + timer_key(row[6], row[5], key))
        for key, row in upserts:
            batch.put(entry + key.encode(), _encoder.encode(row))
            if row[5] is not None:
                batch.put(prefix + timer_key(row[6], row[5], key), b"")
        for key in deletes:
            batch.delete(entry + key.encode())
        batch.put(self._meta, json.dumps({**header, "keys": keys}).encode())
        db.write(batch)
        return keys


def entry_row(entry: KeyEntry, state_bytes: bytes | None) -> Row:
    """A KeyEntry as a stored row (state already encoded)."""
    return (
        state_bytes,
        entry.last_offset,
        entry.last_ts,
        entry.kafka_key,
        entry.seq,
        entry.timer,
        entry.timer_kind,
        entry.ignored,
    )
