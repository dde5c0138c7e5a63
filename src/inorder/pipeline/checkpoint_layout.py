"""The files under a pipeline's checkpoint root, local or S3, and the one class that owns them.

A checkpoint root holds::

    <root>/spark/                     Spark's offsets and commits logs (which offsets each
                                      micro-batch covered)
    <root>/engine/                    inorder's versioned per-partition state and batch times
    <root>/inorder-checkpoint.json    the info file: the checkpoint's id (owner of its output),
                                      the identity of the pipeline that runs on it and the
                                      settings it ran with, and what ``inorder repair`` adds
                                      (batch id offset, starting offsets, a pending repair)
    <root>/inorder-lease.json         the owner lease of the running driver (its epoch fences
                                      commits: :mod:`inorder.pipeline.lease`)

Every reader and writer of these paths goes through :class:`CheckpointLayout`, so the info file
is read the same way (local or S3) everywhere and a damaged one is a named error.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from inorder.errors import ConfigError, InorderError
from inorder.pipeline.lease import DEFAULT_DURATION, CheckpointLease, lease_store
from inorder.storage import fs as sfs

#: The checkpoint's info file (its id, the pipeline identity, what ``inorder repair`` adds).
CHECKPOINT_FILE = "inorder-checkpoint.json"
#: Spark's checkpoint directory (offsets and commits logs), under the root.
SPARK_DIR = "spark"
#: inorder's state checkpoint directory, under the root.
ENGINE_DIR = "engine"
#: Held (``flock``) by the run using a local checkpoint; says who holds it.
RUN_LOCK_FILE = ".inorder-run.lock"
#: Spark's log of a run on a local checkpoint (its stack traces, never on the terminal).
RUN_LOG_FILE = "inorder-run.log"


class CheckpointInfoError(InorderError):
    """The checkpoint's info file exists but cannot be read as JSON."""


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

    def planned_batches(self) -> list[int]:
        """Batch ids in Spark's offsets log, ascending: the micro-batches planned so far."""
        location = self.location
        offsets = sfs.list_files(location, location.join(SPARK_DIR, "offsets"))
        return sorted(int(info.base_name) for info in offsets if info.base_name.isdigit())

    def offsets_entry(self, batch_id: int) -> str | None:
        """The text of Spark's offsets-log entry for ``batch_id`` (``None``: not planned)."""
        location = self.location
        data = sfs.read_bytes_if_exists(
            location, location.join(SPARK_DIR, "offsets", str(batch_id))
        )
        return None if data is None else data.decode("utf-8", "replace")

    def read_info(self) -> dict[str, Any] | None:
        """The info file's content, or ``None`` when the checkpoint has none yet."""
        data = sfs.read_bytes_if_exists(self.location, self.info_path)
        if data is None:
            return None
        try:
            info = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointInfoError(
                f"checkpoint {self.root}: {CHECKPOINT_FILE} is damaged ({exc}); restore it from "
                "a backup, or repair the checkpoint with `inorder repair PIPELINE`"
            ) from None
        if not isinstance(info, dict):
            raise CheckpointInfoError(
                f"checkpoint {self.root}: {CHECKPOINT_FILE} does not hold a JSON object"
            )
        return info

    def write_info(self, info: dict[str, Any]) -> None:
        """Replace the info file (the caller keeps the fields it does not change)."""
        data = json.dumps(info, indent=1, sort_keys=True).encode()
        sfs.write_bytes(self.location, self.info_path, data)

    def update_info(self, **changes: Any) -> dict[str, Any]:
        """Set fields of the info file, keeping the others; return the new content."""
        info = self.read_info() or {}
        info.update(changes)
        self.write_info(info)
        return info

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
        info = self.read_info()
        if info is None or not isinstance(info.get("id"), str):
            raise CheckpointInfoError(
                f"checkpoint {self.root}: {CHECKPOINT_FILE} has no id; restore it from a "
                "backup or start a new checkpoint"
            )
        owner: str = info["id"]
        return owner

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
