"""Local caches kept open by a Python worker between micro-batches.

Opening a topic-partition's RocksDB cache costs ~50 ms (and reading its header, listing its
files); Spark's Python workers are reused across tasks, so a worker keeps the caches it
opened and hands the same handle to the partition's next task when that task lands in the
same process. Whether the cache still holds the right version is checked by the store as
for any cache (epoch and version against the checkpoint): keeping it open only saves the
open, never skips that check.

RocksDB lets one process use a directory at a time, and a partition's next task may run in
another worker process of the same executor. So a cache directory is a *slot*,
``<topic>-<partition>`` (slot 0) or ``<topic>-<partition>@<n>``, owned by whichever process
holds the ``flock`` of ``<slot>.lock``. A process whose slot is held elsewhere takes the next
free slot (its content, at whatever version another process left it, is brought up to date
by the store); the kernel releases a dead process's locks (kill -9 included), so its slots
are simply reused. A slot directory or lock file removed underneath an open handle (the
temp directory cleaned, the executor's directory deleted) is detected by comparing inodes
and the handle is dropped.

Everything here is per process and not thread-safe beyond a lock around the registry; a
forked child forgets its parent's handles (they belong to the parent).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass

from inorder.state.cache import CacheBusy, LocalCache

#: Slots tried per topic-partition before falling back to a private, throw-away cache.
MAX_SLOTS = 8


@dataclass(slots=True)
class HeldCache:
    """An open cache and the locks that make this process its owner."""

    cache: LocalCache
    path: str
    lock_fd: int | None = None
    dir_fd: int | None = None
    in_use: bool = True
    private_dir: str | None = None
    reused: bool = False

    def intact(self) -> bool:
        """Whether the slot's lock file and directory are still the ones this handle holds."""
        if self.lock_fd is None or self.dir_fd is None:
            return False
        try:
            lock_now = os.stat(self.path + ".lock")
            dir_now = os.stat(self.path)
            lock_held = os.fstat(self.lock_fd)
            dir_held = os.fstat(self.dir_fd)
        except OSError:
            return False
        return os.path.samestat(lock_now, lock_held) and os.path.samestat(dir_now, dir_held)

    def close(self) -> None:
        """Close the database and release the slot."""
        with contextlib.suppress(Exception):  # a deleted directory may fail the close
            self.cache.close()
        for fd in (self.dir_fd, self.lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.dir_fd = self.lock_fd = None
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)
            self.private_dir = None


class CacheRegistry:
    """The caches this process holds, least recently used first."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, HeldCache] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # a forked child: the handles are the parent's
            self._held = OrderedDict()
            self._lock = threading.Lock()
            self._pid = os.getpid()

    def acquire(self, base: str, keep_open: int) -> HeldCache:
        """A cache for the slots at ``base``: one this process holds, else a free slot.

        Falls back to a private cache in a new temp directory when every slot is taken.
        """
        self._check_pid()
        with self._lock:
            for path in _slot_paths(base):
                held = self._held.get(path)
                if held is None or held.in_use:
                    continue
                if held.intact():
                    held.in_use = True
                    held.reused = True
                    self._held.move_to_end(path)
                    return held
                del self._held[path]
                held.close()
            for path in _slot_paths(base):
                if path in self._held:
                    continue
                opened = _open_slot(path)
                if opened is not None:
                    self._held[path] = opened
                    self._evict(keep_open)
                    return opened
        private = tempfile.mkdtemp(prefix="inorder-cache-")
        return HeldCache(LocalCache(os.path.join(private, "db")), private, private_dir=private)

    def release(self, held: HeldCache, keep_open: int) -> None:
        """Return ``held`` after a task; it stays open unless ``keep_open`` is 0."""
        self._check_pid()
        with self._lock:
            held.in_use = False
            registered = self._held.get(held.path) is held
            if not registered or keep_open <= 0:
                if registered:
                    del self._held[held.path]
                held.close()
                return
            self._evict(keep_open)

    def discard(self, held: HeldCache) -> None:
        """Close ``held`` for good (its content is not trusted any more)."""
        self._check_pid()
        with self._lock:
            if self._held.get(held.path) is held:
                del self._held[held.path]
            held.close()

    def close_all(self) -> None:
        """Close every cache not in use."""
        self._check_pid()
        with self._lock:
            for path, held in list(self._held.items()):
                if not held.in_use:
                    del self._held[path]
                    held.close()

    def held_paths(self) -> list[str]:
        """Slot paths this process holds open (for tests and diagnostics)."""
        self._check_pid()
        return list(self._held)

    def _evict(self, keep_open: int) -> None:
        idle = [p for p, h in self._held.items() if not h.in_use]
        excess = len(self._held) - min(max(keep_open, 0), _fd_budget())
        for path in idle[: max(excess, 0)]:
            self._held.pop(path).close()


#: File descriptors one open cache holds: RocksDB's lock, info log, WAL, manifest and table
#: files (about 6, more after flushes) and the slot's lock and directory.
_FDS_PER_CACHE = 10
#: Descriptors left for everything else of the process (sockets, Parquet files, Kafka).
_FDS_RESERVED = 512


def _fd_budget() -> int:
    """How many caches this process may keep open within its open file limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 32
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max((soft - _FDS_RESERVED) // _FDS_PER_CACHE, 0)


def _slot_paths(base: str) -> list[str]:
    return [base if n == 0 else f"{base}@{n}" for n in range(MAX_SLOTS)]


def _open_slot(path: str) -> HeldCache | None:
    """Lock and open the slot at ``path``; ``None`` when another process holds it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        cache = LocalCache(path)
    except CacheBusy:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    dir_fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    return HeldCache(cache, path, lock_fd=fd, dir_fd=dir_fd)


#: This process's registry.
REGISTRY = CacheRegistry()
