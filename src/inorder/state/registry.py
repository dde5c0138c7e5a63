"""The local cache database a Python worker keeps open between micro-batches.

Opening a RocksDB database costs ~50 ms, and Spark hands each engine task to whichever of its
Python workers is idle, so a topic-partition's next task often runs in another process. A
worker process therefore holds *one* database per checkpoint, for every topic-partition it
serves, each under a key prefix of its own (:mod:`inorder.state.cache`): it is opened by the
process's first task and stays open, so no later task opens a database, whichever partition
it applies. Whether a partition's view holds the right version is checked by the store as for
any cache (epoch, version and attempt against the checkpoint); a partition that ran in
another process meanwhile finds its view behind and catches up from the checkpoint's deltas
(or is rebuilt when it never ran here or its version was cleaned up).

RocksDB lets one process use a directory at a time. So a database directory is a *process
slot*, ``<cache_dir>/<sha1(checkpoint root)[:16]>/proc@<n>``, owned by whichever process holds
the ``flock`` of ``proc@<n>.lock``; a process takes the first free slot. The kernel releases a
dead process's locks (kill -9 included), so its slot, with whatever versions its partitions
hold, is simply reused by the next process. A slot directory or lock file removed underneath
an open handle (the temp directory cleaned, the executor's directory deleted) is detected by
comparing inodes and the handle is dropped. The database itself lives in a directory of a
name made when it is created, ``proc@<n>/db-<random>``: RocksDB's close deletes, *by path*,
every file of its directory it does not know, so a dropped handle whose slot another process
has made anew since must not find that process's database at its path. When every slot is
held, the process uses a private database in a new temp directory (deleted when closed); a
second store of a topic-partition whose view is in use in this process (a concurrent attempt)
gets a private, throw-away database of its own.

A task that applies many topic-partitions (the source's range groups: a group keeps its
partitions batch after batch) names a *task slot* of its own, ``group@<n>``, by the Spark
partition it runs as: whichever process runs group ``n`` next opens that database, whose views
are the group's partitions as of their last batch, so a group that moves to another process
costs one database open (tens of milliseconds) instead of catching every partition up from
the checkpoint (about 2 ms each). The task closes its slot when it ends, freeing it for the
process that runs the group next; a task slot held by another process (a concurrent attempt)
is not waited for: that task uses the process slot as before.

Earlier releases kept one directory per topic-partition (``<topic>-<partition>[@<n>]``) in the
same place: a process opening a slot of a checkpoint deletes those nobody holds the lock of
(caches are only copies of the checkpoint).

``keep_open`` (:class:`~inorder.state.store.StateOptions`) is how many databases (one per
checkpoint) a process keeps open, least recently used closed first, and no more than its open
file limit allows (each database keeps at most ``MAX_OPEN_FILES`` table files open); 0 closes
the database after each task, so every task opens it again. A slot holds the view of every
partition that ran in its processes, also of those that moved away for good: on disk, each
slot can grow to the state of all the checkpoint's partitions it served.

Everything here is per process and not thread-safe beyond a lock around the registry; a
forked child forgets its parent's handles (they belong to the parent).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from inorder.state.cache import MAX_OPEN_FILES, CacheBusy, CacheDB, LocalCache

#: Process slots tried per checkpoint before falling back to a private database.
MAX_SLOTS = 64
_SLOT = re.compile(r"(proc|group)@\d+")


@dataclass(slots=True)
class ProcessDB:
    """An open database and the locks that make this process its owner."""

    db: CacheDB
    base: str
    #: The slot's directory (``proc@<n>``, ``group@<n>``); the database is in :attr:`db_dir`.
    path: str
    #: The registry's key: ``base`` for a process slot, the slot's path for a task slot.
    key: str
    db_dir: str
    lock_fd: int | None = None
    dir_fd: int | None = None
    private_dir: str | None = None
    #: The views this handle served, by prefix (to tell a partition seen before).
    views: dict[bytes, HeldCache] = field(default_factory=dict)
    #: Views handed out and not released yet.
    users: int = 0

    def intact(self) -> bool:
        """Whether the slot's lock file and directory are still the ones this handle holds."""
        if self.dir_fd is None or (self.lock_fd is None and self.private_dir is None):
            return False
        try:
            if not os.path.samestat(os.stat(self.db_dir), os.fstat(self.dir_fd)):
                return False
            if self.lock_fd is None:
                return True
            return os.path.samestat(os.stat(self.path + ".lock"), os.fstat(self.lock_fd))
        except OSError:
            return False

    def close(self) -> None:
        """Close the database and release the slot."""
        with contextlib.suppress(Exception):  # a deleted directory may fail the close
            self.db.close()
        for fd in (self.dir_fd, self.lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.dir_fd = self.lock_fd = None
        self.views.clear()
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)
            self.private_dir = None


@dataclass(slots=True)
class HeldCache:
    """One topic-partition's view, handed to a store for one task."""

    cache: LocalCache
    owner: ProcessDB
    prefix: bytes
    in_use: bool = True
    #: This process's database served this topic-partition in an earlier task.
    reused: bool = False
    #: Acquiring the view opened a database.
    opened: bool = False
    #: A throw-away database of its own (closed and deleted on release).
    private: bool = False


class CacheRegistry:
    """The databases this process holds (one per checkpoint), least recently used first."""

    def __init__(self) -> None:
        self._dbs: OrderedDict[str, ProcessDB] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # a forked child: the handles are the parent's
            self._dbs = OrderedDict()
            self._lock = threading.Lock()
            self._pid = os.getpid()

    def acquire(
        self, base: str, prefix: bytes, keep_open: int, slot: str | None = None
    ) -> HeldCache:
        """The view ``prefix`` of this process's database for the slots at ``base``.

        Opens the database (a free process slot, else a private one) when the process holds
        none for ``base``; a view already in use gets a private database of its own. With
        ``slot`` (a task slot's name, ``group@<n>``) the view is that slot's, unless another
        process holds it (then the process slot's); :meth:`close_slot` closes it.
        """
        self._check_pid()
        with self._lock:
            opened = False
            db = self._registered(os.path.join(base, slot)) if slot else None
            if slot and db is None:
                db = _open_slot(base, slot)
                opened = db is not None
            if db is None:
                db = self._registered(base)
            if db is None:
                db = _open_slot(base, None) or _private_db(base)
                opened = True
            self._dbs[db.key] = db
            self._dbs.move_to_end(db.key)
            held = db.views.get(prefix)
            if held is not None and held.in_use:  # a concurrent store of this partition
                private = _private_db(base)
                return HeldCache(
                    private.db.view(prefix), private, prefix, opened=True, private=True
                )
            if held is None:
                held = HeldCache(db.db.view(prefix), db, prefix)
                db.views[prefix] = held
            else:
                held.reused = True
            held.in_use = True
            held.opened = opened
            db.users += 1
            self._evict(keep_open)
            return held

    def close_slot(self, base: str, slot: str) -> None:
        """Close the task slot ``slot`` at ``base`` (now, or when its last view is returned),
        so that the process that runs its task next can open it."""
        self._check_pid()
        with self._lock:
            db = self._dbs.get(os.path.join(base, slot))
            if db is not None:
                self._forget(db)

    def _registered(self, key: str) -> ProcessDB | None:
        """The open database registered under ``key``, if it is still intact."""
        db = self._dbs.get(key)
        if db is not None and not db.intact():
            self._forget(db)
            return None
        return db

    def release(self, held: HeldCache, keep_open: int) -> None:
        """Return ``held`` after a task; its database stays open unless ``keep_open`` is 0."""
        self._check_pid()
        with self._lock:
            self._returned(held, keep_open)

    def discard(self, held: HeldCache, keep_open: int) -> None:
        """Forget ``held``'s view (its content is not trusted any more) and return it.

        The database stays open for the other partitions' views (as :meth:`release`).
        """
        self._check_pid()
        with self._lock:
            if held.owner.views.get(held.prefix) is held:
                del held.owner.views[held.prefix]
            self._returned(held, keep_open)

    def close_all(self) -> None:
        """Close every database no view of which is in use."""
        self._check_pid()
        with self._lock:
            for base, db in list(self._dbs.items()):
                if db.users == 0:
                    del self._dbs[base]
                    db.close()

    def held_paths(self) -> list[str]:
        """Database paths this process holds open (for tests and diagnostics)."""
        self._check_pid()
        return [db.path for db in self._dbs.values()]

    def _returned(self, held: HeldCache, keep_open: int) -> None:
        self._let_go(held)
        db = held.owner
        if keep_open <= 0 and db.users == 0 and self._dbs.get(db.key) is db:
            del self._dbs[db.key]
            db.close()
            return
        self._evict(keep_open)

    def _let_go(self, held: HeldCache) -> None:
        """Mark ``held`` returned; close a database nobody uses that is no longer registered."""
        if held.private:
            held.owner.close()
            return
        if not held.in_use:
            return
        held.in_use = False
        db = held.owner
        db.users -= 1
        if db.users == 0 and self._dbs.get(db.key) is not db:
            db.close()

    def _forget(self, db: ProcessDB) -> None:
        """Unregister ``db`` (closed now, or when its last view in use is returned)."""
        del self._dbs[db.key]
        if db.users == 0:
            db.close()

    def _evict(self, keep_open: int) -> None:
        idle = [db for db in self._dbs.values() if db.users == 0]
        excess = len(self._dbs) - min(max(keep_open, 0), _fd_budget())
        for db in idle[: max(excess, 0)]:
            del self._dbs[db.key]
            db.close()


#: File descriptors one open database holds: its table files, RocksDB's lock, info log, WAL
#: and manifest, and the slot's lock and directory.
_FDS_PER_DB = MAX_OPEN_FILES + 10
#: Descriptors left for everything else of the process (sockets, Parquet files, Kafka).
_FDS_RESERVED = 512


def _fd_budget() -> int:
    """How many databases this process may keep open within its open file limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max((soft - _FDS_RESERVED) // _FDS_PER_DB, 0)


def _open_slot(base: str, slot: str | None) -> ProcessDB | None:
    """Lock and open the task slot ``slot`` at ``base``, or (``None``) the first free process
    slot; ``None`` when it is (they all are) held by other processes."""
    os.makedirs(base, exist_ok=True)
    if slot is None:
        _remove_old_slots(base)
    names = [slot] if slot is not None else [f"proc@{n}" for n in range(MAX_SLOTS)]
    for name in names:
        path = os.path.join(base, name)
        fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            db_dir = _database_dir(path)
            db = CacheDB(db_dir)
        except CacheBusy:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        dir_fd = os.open(db_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        key = base if slot is None else path  # a process slot is registered by its base
        return ProcessDB(db, base, path, key, db_dir, lock_fd=fd, dir_fd=dir_fd)
    return None


def _database_dir(slot_dir: str) -> str:
    """The database directory of the slot at ``slot_dir`` (whose lock the caller holds).

    The one there, else a new name. Anything else in the slot (a database of an earlier
    release, which kept its files in the slot itself) is deleted: a cache is only a copy.
    """
    os.makedirs(slot_dir, exist_ok=True)
    names = os.listdir(slot_dir)
    databases = [n for n in names if n.startswith("db-")]
    if len(databases) == 1 and len(names) == 1:
        return os.path.join(slot_dir, databases[0])
    for name in names:
        entry = os.path.join(slot_dir, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry)
    return os.path.join(slot_dir, f"db-{secrets.token_hex(8)}")


def _private_db(base: str) -> ProcessDB:
    """A database in a new temp directory, deleted when closed."""
    private = tempfile.mkdtemp(prefix="inorder-cache-")
    path = os.path.join(private, "db")
    db = CacheDB(path)
    dir_fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    return ProcessDB(db, base, path, base, path, dir_fd=dir_fd, private_dir=private)


def _remove_old_slots(base: str) -> None:
    """Delete the per-partition slot directories of earlier releases that nobody holds."""
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            if not name.endswith(".lock") or _SLOT.fullmatch(name[: -len(".lock")]):
                continue
            lock = os.path.join(base, name)
            try:
                fd = os.open(lock, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a process of an earlier release still uses it
                os.close(fd)
                continue
            # Held while deleting: a process of an earlier release that opens the lock file
            # meanwhile does not get it, and one that opens it afterwards creates a new one.
            shutil.rmtree(lock[: -len(".lock")], ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(lock)
            os.close(fd)


#: This process's registry.
REGISTRY = CacheRegistry()
