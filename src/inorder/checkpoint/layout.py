"""The files under a pipeline's checkpoint root, local or S3, and the one class that owns them.

A checkpoint root holds::

    <root>/spark/                     Spark's offsets and commits logs (which offsets each
                                      micro-batch covered: :mod:`inorder.checkpoint.spark_log`)
    <root>/engine/                    inorder's versioned per-partition state and batch times
                                      (:mod:`inorder.state.checkpoint`)
    <root>/inorder-checkpoint.json    the info file (:mod:`inorder.checkpoint.info`): the
                                      checkpoint's id (owner of its output), the identity of
                                      the pipeline that runs on it and the settings it ran with,
                                      and what ``inorder repair`` adds
    <root>/inorder-lease.json         the owner lease of the running driver (its epoch fences
                                      commits: :mod:`inorder.checkpoint.lease`)
    <root>/inorder-batches.jsonl      each batch's progress line (local checkpoints only)

Every reader and writer of these paths goes through :class:`CheckpointLayout` (the names are
in :mod:`inorder.checkpoint.names`), so the info file and Spark's logs are read the same way,
local or S3, everywhere, and a damaged info file is a named error. The layout is built once,
where a path enters (a command, the runner, the ops tools' target), and handed down.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from inorder.checkpoint.info import CheckpointInfo, CheckpointInfoError, read_raw
from inorder.checkpoint.lease import DEFAULT_DURATION, CheckpointLease, lease_store
from inorder.checkpoint.names import (
    CHECKPOINT_FILE,
    ENGINE_DIR,
    HISTORY_FILE,
    REPAIR_BACKUP_INFIX,
    REPAIR_NEW_SUFFIX,
    RUN_LOCK_FILE,
    RUN_LOG_FILE,
    SOURCE_HIGHS_FILE,
    SPARK_DIR,
    WRITE_PROBE_FILE,
)
from inorder.checkpoint.spark_log import SparkLog
from inorder.errors import ConfigError
from inorder.storage import fs as sfs


@dataclass(frozen=True)
class CheckpointLayout:
    """Paths and the info file of one pipeline checkpoint (nothing is touched on creation)."""

    root: str

    @classmethod
    def of(cls, checkpoint: str | Path) -> CheckpointLayout:
        """The layout of a checkpoint root given as a path or URI."""
        return cls(str(checkpoint).rstrip("/"))

    @property
    def spark_dir(self) -> str:
        """Spark's checkpoint directory (offsets and commits logs)."""
        return f"{self.root}/{SPARK_DIR}"

    @property
    def engine_dir(self) -> str:
        """inorder's state checkpoint directory."""
        return f"{self.root}/{ENGINE_DIR}"

    @cached_property
    def location(self) -> sfs.Location:
        """The resolved filesystem location of the root."""
        return sfs.resolve(self.root)

    @property
    def info_path(self) -> str:
        """The info file's path inside :attr:`location`."""
        return self.location.join(CHECKPOINT_FILE)

    @cached_property
    def spark_log(self) -> SparkLog:
        """Spark's offsets and commits logs (read through the storage layer)."""
        return SparkLog(self.location, self.location.join(SPARK_DIR))

    def planned_batches(self) -> list[int]:
        """Batch ids in Spark's offsets log, ascending: the micro-batches planned so far."""
        return self.spark_log.planned()

    def offsets_entry(self, batch_id: int) -> str | None:
        """The text of Spark's offsets-log entry for ``batch_id`` (``None``: not planned)."""
        return self.spark_log.entry_text(batch_id)

    def read_info(self) -> dict[str, Any] | None:
        """The info file's JSON object as stored (``None``: no file yet); :meth:`info` is the
        typed record."""
        return read_raw(self.location, self.info_path)

    def info(self) -> CheckpointInfo | None:
        """The info file as a record, or ``None`` when the checkpoint has none yet."""
        return CheckpointInfo.read(self.location, self.info_path)

    def owner(self) -> str | None:
        """The checkpoint's id when it has one (read only: :meth:`ensure_owner` creates it)."""
        info = self.info()
        return None if info is None else info.id

    def write_info(self, info: CheckpointInfo) -> None:
        """Replace the info file (the caller keeps the fields it does not change)."""
        info.write(self.location, self.info_path)

    def exists(self) -> bool:
        """Whether anything is stored under the root."""
        if not self.location.is_s3:
            return os.path.exists(self.location.root)
        return bool(sfs.list_files(self.location, self.location.root, recursive=True))

    def staged(self) -> CheckpointLayout:
        """Where ``inorder repair`` builds the fresh checkpoint before it takes the root."""
        return CheckpointLayout((self.local_root or self.root) + REPAIR_NEW_SUFFIX)

    def backup(self, stamp: str) -> CheckpointLayout:
        """Where ``inorder repair`` moves the old checkpoint (``stamp``: a UTC time)."""
        return CheckpointLayout(f"{self.local_root or self.root}{REPAIR_BACKUP_INFIX}{stamp}")

    def remove(self) -> None:
        """Delete everything under the root (nothing happens when it does not exist)."""
        local = self.local_root
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)
            return
        for item in sfs.list_files(self.location, self.location.root, recursive=True):
            sfs.delete_quietly(self.location, item.path)

    def move_to(self, other: CheckpointLayout) -> None:
        """Move everything under the root to ``other``'s root (same filesystem).

        Locally one ``rename(2)``; on S3, which has no directories, each object is copied
        then deleted (a crash part way leaves both halves, which :meth:`exists` still sees).
        """
        if not self.location.is_s3:
            os.rename(self.location.root, other.location.root)
            return
        root = self.location.root.rstrip("/")
        for item in sfs.list_files(self.location, root, recursive=True):
            rel = item.path[len(root) :].lstrip("/")
            sfs.move(self.location, item.path, other.location.join(rel))

    def write_probe(self) -> None:
        """Check that a local root can be written (created when missing); S3 is checked by
        the stores that write it."""
        local = self.local_root
        if local is None:
            return
        path = Path(local)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / WRITE_PROBE_FILE
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"checkpoint {self.root!r} is not writable: {exc.strerror}") from None

    @property
    def history_file(self) -> str | None:
        """The batch history file of a local checkpoint (``None`` on an object store)."""
        local = self.local_root
        return None if local is None else os.path.join(local, HISTORY_FILE)

    @property
    def source_highs_file(self) -> str | None:
        """The source planner's last-seen ends of a local checkpoint (``None`` on an object
        store)."""
        local = self.local_root
        return None if local is None else os.path.join(local, SOURCE_HIGHS_FILE)

    @property
    def run_lock_file(self) -> str | None:
        """The run lock file of a local checkpoint (``None`` on an object store)."""
        local = self.local_root
        return None if local is None else os.path.join(local, RUN_LOCK_FILE)

    def ensure_owner(self) -> str:
        """The checkpoint's id: created with the checkpoint, kept for its whole life.

        Sinks are bound to it (:meth:`inorder.sinks.base.Sink.bind`): batch ids restart with
        every checkpoint, so output committed under another id must not count as committed.
        """
        location = self.location
        if not location.is_s3:
            try:
                location.filesystem.create_dir(location.root, recursive=True)
            except OSError as exc:
                raise ConfigError(f"checkpoint {self.root!r} is not writable: {exc}") from None
        with contextlib.suppress(sfs.AlreadyExists):  # created by an earlier run: keep it
            sfs.put_if_absent(
                location, self.info_path, json.dumps({"id": uuid.uuid4().hex}).encode()
            )
        info = self.info()
        if info is None or info.id is None:
            raise CheckpointInfoError(
                f"checkpoint {self.root}: {CHECKPOINT_FILE} has no id; restore it from a "
                "backup or start a new checkpoint"
            )
        return info.id

    @property
    def local_root(self) -> str | None:
        """The root as a local path, or ``None`` for an object store."""
        if self.location.is_s3:
            return None
        return os.path.abspath(self.root.removeprefix("file://"))

    def run_log_file(self, pipeline_name: str) -> str:
        """Where a run's Spark log goes: in a local checkpoint, else the temp directory."""
        local = self.local_root
        if local is not None:
            return os.path.join(local, RUN_LOG_FILE)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in pipeline_name)
        return os.path.join(tempfile.gettempdir(), f"inorder-{safe}.log")

    def lease(
        self, duration: float = DEFAULT_DURATION, info: Callable[[str], None] | None = None
    ) -> CheckpointLease:
        """The owner lease of this checkpoint (not yet acquired); local or S3 alike."""
        return CheckpointLease(lease_store(self.location), duration, info=info)

    @contextlib.contextmanager
    def run_lock(self) -> Iterator[None]:
        """Hold the checkpoint for one run; a second copy is refused by name at once.

        Two queries writing one checkpoint would fail deep inside Spark (its offsets log
        detects the race) after both started; the lock names the holder before anything
        starts, and is released the moment its holder dies. Local checkpoints only: an
        object store has no lock; there the owner lease (:meth:`lease`) is the guard, and it
        is taken on local checkpoints too, after this lock, to fence commits.
        """
        local = self.local_root
        if local is None:
            yield
            return
        import fcntl

        os.makedirs(local, exist_ok=True)
        path = os.path.join(local, RUN_LOCK_FILE)
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held for the whole run)
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise ConfigError(
                    f"checkpoint {self.root} is in use by another run ({holder}); stop that "
                    "copy first, or give this one its own pipeline.checkpoint"
                ) from None
            handle.seek(0)
            handle.truncate()
            started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {started}")
            handle.flush()
            yield
        finally:
            handle.close()


__all__ = [
    "CHECKPOINT_FILE",
    "ENGINE_DIR",
    "RUN_LOCK_FILE",
    "RUN_LOG_FILE",
    "SPARK_DIR",
    "CheckpointInfoError",
    "CheckpointLayout",
]
