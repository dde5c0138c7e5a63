"""Many small local files made durable together: written without fsync, then one sync.

A task of the partition backend writes one state file per topic-partition, each made durable
on its own by :func:`inorder.storage.fs.write_bytes` (an fsync of the file and one of its
directory). With hundreds of topic-partitions per task those fsyncs were most of the state
commit: 5-10 ms per file on this machine under load, against 0.1 ms for the write itself.
Nothing needs a state file durable before the task returns its results (the driver's sink
commit, the batch's commit point, comes after), so the files are written without fsync
(:func:`write_unsynced`) and made durable together when the task's last one is written
(:func:`make_durable`): one ``syncfs`` of the filesystem on Linux, else an fsync of each file
and directory. A crash before that point leaves files of a batch that was never committed,
which the next attempt replaces, as after any crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import uuid
from collections.abc import Sequence

from inorder.errors import StorageError

#: Fewer files than this are fsynced one by one: a syncfs also flushes every other process's
#: dirty data on the filesystem, which only pays off for many files.
SYNCFS_FROM = 8


def write_unsynced(path: str, data: bytes) -> None:
    """Write a local file whole (temp file + rename) without making it durable yet."""
    replace_file(path, data, sync=False)


def replace_file(path: str, data: bytes, *, sync: bool) -> None:
    """Write a local file whole: a temp file (fsynced when ``sync``) renamed over ``path``.

    ``OSError`` propagates (the temp file removed) for the caller to name the file.
    """
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    try:
        try:
            out = open(tmp, "wb")  # noqa: SIM115 - closed below; the directory usually exists
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            out = open(tmp, "wb")  # noqa: SIM115
        with out:
            out.write(data)
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_durable(paths: Sequence[str]) -> None:
    """Make files written by :func:`write_unsynced`, and their names, durable."""
    if not paths:
        return
    if len(paths) >= SYNCFS_FROM and _syncfs(os.path.dirname(paths[0])):
        return
    for path in paths:
        _fsync(path)
    for directory in sorted({os.path.dirname(p) for p in paths}):
        _fsync(directory)


def _fsync(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise StorageError(f"cannot make {path} durable: {exc.strerror or exc}") from None
    try:
        os.fsync(fd)
    except OSError as exc:
        if os.path.isdir(path):  # some filesystems cannot fsync a directory: nothing to do
            return
        raise StorageError(f"cannot make {path} durable: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _syncfs(directory: str) -> bool:
    """``syncfs`` of the filesystem holding ``directory``; False where there is none."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(directory, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            # Since Linux 5.8 syncfs reports writeback errors of the filesystem.
            reason = os.strerror(ctypes.get_errno())
            raise StorageError(f"cannot make state files durable in {directory}: {reason}")
    finally:
        os.close(fd)
    return True
