"""The per-worker local cache of one topic-partition's state: a RocksDB database (rocksdict).

The checkpoint is the truth; this cache only saves re-reading it every batch. It records the
checkpoint epoch and the state version it holds, and the store uses it only when both match
what the checkpoint says is current (else it is rebuilt from the checkpoint). Entries and the
version change in one atomic ``WriteBatch``, so a crash never leaves a cache claiming a
version it does not hold. State larger than memory lives on local disk; RocksDB keeps only
its block cache and write buffers in memory.

Key layout (raw bytes):

* ``k<key utf-8>`` -> msgpack ``[state, last_offset, last_ts, kafka_key, seq, timer,
  timer_kind, ignored]``
* ``t<kind><deadline+2**63 big-endian 8 bytes><key utf-8>`` -> empty: the timer index, ordered
  by (kind, deadline, key) exactly as the engine orders timers
* ``m`` -> JSON ``{"epoch", "version", "meta"}``
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
    """The index key of a timer."""
    return _TIMER + bytes((kind,)) + (deadline + _BIAS).to_bytes(8, "big") + key.encode()


#: Memtable size of one cache.
_WRITE_BUFFER_BYTES = 4 << 20
#: Block cache shared by all caches of one process.
_BLOCK_CACHE_BYTES = 32 << 20
_shared_block_cache: tuple[int, Any] | None = None
#: Unflushed writes of all caches of one process together: a worker keeps up to a thousand
#: caches open (state/registry.py), and 2 x 4 MiB each would be gigabytes; past this limit
#: RocksDB flushes the largest memtables to their files.
_WRITE_BUFFERS_BYTES = 64 << 20
_shared_write_buffers: tuple[int, Any] | None = None


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
    """The write buffer manager shared by this process's caches (made after a fork)."""
    global _shared_write_buffers
    from rocksdict import WriteBufferManager

    if _shared_write_buffers is None or _shared_write_buffers[0] != os.getpid():
        _shared_write_buffers = (os.getpid(), WriteBufferManager(_WRITE_BUFFERS_BYTES, False))
    return _shared_write_buffers[1]


class CacheBusy(Exception):
    """Another process holds this cache (e.g. a concurrent attempt of the same task)."""


class LocalCache:
    """One topic-partition's entries in a local RocksDB, with the version they represent."""

    def __init__(self, path: str) -> None:
        from rocksdict import Options, Rdict

        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Every open rotates RocksDB's info log; without a limit old logs pile up per open.
        options.set_keep_log_file_num(2)
        # A worker keeps many caches open between batches (state/registry.py): bound what each
        # holds in memory. Unflushed writes: at most 2 x 4 MiB per cache (RocksDB's default
        # is 64 MiB each); read blocks: one LRU cache shared by the process's caches.
        options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
        options.set_max_write_buffer_number(2)
        options.set_write_buffer_manager(_write_buffer_manager())
        options.set_block_based_table_factory(_table_options())
        try:
            self._db: Any = Rdict(path, options)
        except Exception as exc:
            if "lock" in str(exc).lower():
                raise CacheBusy(str(exc)) from None
            # A damaged cache is not worth diagnosing: it is only a copy of the checkpoint.
            shutil.rmtree(path, ignore_errors=True)
            self._db = Rdict(path, options)

    def close(self) -> None:
        """Release the database (and its lock)."""
        self._db.close()

    def __enter__(self) -> LocalCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- version -----------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """``{"epoch", "version", "meta"}`` (version -1 and no epoch when empty)."""
        raw = self._db.get(_META)
        if raw is None:
            return {"epoch": None, "version": -1, "meta": {}}
        loaded: dict[str, Any] = json.loads(raw)
        return loaded

    def clear(self) -> None:
        """Drop everything."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        batch.delete_range(b"\x00", b"\xff")
        self._db.write(batch)

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> Row | None:
        """The stored row of ``key``."""
        raw = self._db.get(_ENTRY + key.encode())
        if raw is None:
            return None
        return tuple(_decoder.decode(raw))

    def timers_after(
        self, kind: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` timers ``(deadline, key)`` of ``kind`` after ``after``, ordered."""
        prefix = _TIMER + bytes((kind,))
        start = prefix if after is None else timer_key(kind, after[0], after[1])
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
        it = self._db.iter()
        it.seek(_ENTRY)
        while it.valid():
            raw = it.key()
            if not raw.startswith(_ENTRY):
                break
            yield raw[1:].decode(), tuple(_decoder.decode(it.value()))
            it.next()

    # -- writes ------------------------------------------------------------------------------

    def write(
        self,
        upserts: list[tuple[str, Row]],
        deletes: list[str],
        header: dict[str, Any],
        *,
        fresh: bool = False,
    ) -> None:
        """Apply changes and set the header, atomically.

        Removes the timer index entries of replaced or deleted keys (``fresh``: the cache is
        known to be empty, skip those reads).
        """
        from rocksdict import WriteBatch

        db = self._db
        batch = WriteBatch(raw_mode=True)
        keys = 0 if fresh else int(self.header().get("keys", 0))
        if fresh:
            keys += len(upserts)
        else:
            upserted = {k for k, _ in upserts}
            for key in (*upserted, *deletes):
                old = db.get(_ENTRY + key.encode())
                if old is None:
                    keys += 1 if key in upserted else 0
                    continue
                if key not in upserted:
                    keys -= 1
                row = _decoder.decode(old)
                if row[5] is not None:
                    batch.delete(timer_key(row[6], row[5], key))
        for key, row in upserts:
            batch.put(_ENTRY + key.encode(), _encoder.encode(row))
            if row[5] is not None:
                batch.put(timer_key(row[6], row[5], key), b"")
        for key in deletes:
            batch.delete(_ENTRY + key.encode())
        batch.put(_META, json.dumps({**header, "keys": keys}).encode())
        db.write(batch)


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
