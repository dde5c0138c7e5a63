"""Batch history: each finished batch's progress line, kept beside a local checkpoint.

Spark's logs and the engine's batch records say which offsets a batch covered and when, but
not where its time went, how many rows and files it wrote or which integrity rules fired.
:class:`BatchHistory` is a :class:`~inorder.pipeline.observer.RunObserver` that appends the
progress line of every batch (the same JSON ``--progress json`` prints, plus the lag per
partition) to ``<checkpoint>/inorder-batches.jsonl``. The file is bounded: past
:data:`MAX_BYTES` it becomes ``inorder-batches.jsonl.1`` (the previous one is dropped), so
a stream running for months keeps its recent history and never fills the disk.

Object-store checkpoints keep the history in memory only (appending to an object means
rewriting it); the status page of the same process still shows it. In memory only the
newest line keeps its lag per partition (the only one read): the memory the lines take does
not grow with the topic-partitions.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.names import HISTORY_FILE
from inorder.pipeline.progress import BatchProgress

__all__ = ["HISTORY_FILE", "MAX_BYTES", "BatchHistory", "read_history"]

#: Size at which the history file is rotated (one older file is kept).
MAX_BYTES = 8 * 1024 * 1024
#: Batches kept in memory (for object-store checkpoints and the same-process page).
MEMORY_BATCHES = 1000


class BatchHistory:
    """Records each batch's progress line (a run observer; never fails the run)."""

    def __init__(self, layout: CheckpointLayout, max_bytes: int = MAX_BYTES) -> None:
        self._path = layout.history_file
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self.recent: deque[dict[str, Any]] = deque(maxlen=MEMORY_BATCHES)
        """The newest lines, oldest first."""

    def on_start(self) -> None:
        """Nothing to do at start."""

    def on_batch(self, progress: BatchProgress, lag_by_partition: dict[str, int] | None) -> None:
        """Append the batch's line (and rotate the file when it grew past the bound)."""
        line = {**asdict(progress), "lag_by_partition": lag_by_partition, "time": time.time()}
        with self._lock:
            if self.recent and self.recent[-1].get("lag_by_partition") is not None:
                # Only the newest line's lag per partition is read (the status page's table);
                # kept on every line in memory it would cost ~130 KB per batch at 1,200
                # topic-partitions, 130 MB for the lines kept. The file keeps them all.
                self.recent[-1] = {**self.recent[-1], "lag_by_partition": None}
            self.recent.append(line)
            if self._path is None:
                return
            data = json.dumps(line, sort_keys=True) + "\n"
            try:
                if os.path.getsize(self._path) + len(data) > self._max_bytes:
                    os.replace(self._path, self._path + ".1")
            except FileNotFoundError:
                pass
            with open(self._path, "a", encoding="utf-8") as handle:
                handle.write(data)

    def on_failure(self, error: BaseException) -> None:
        """Nothing to record: the failure is in the run log."""

    def on_stop(self) -> None:
        """Nothing to release."""


def _lines(path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for text in handle:
                try:
                    doc = json.loads(text)
                except json.JSONDecodeError:
                    continue  # a line cut short by a crash: the others still count
                if isinstance(doc, dict) and isinstance(doc.get("batch_id"), int):
                    out.append(doc)
    except OSError:
        return []
    return out


def read_history(
    layout: CheckpointLayout, recent: list[dict[str, Any]] | None = None
) -> dict[int, Any]:
    """The recorded lines by batch id (the file's, then ``recent`` ones from memory).

    A batch recorded twice (a re-run after a crash) keeps its newest line.
    """
    path = layout.history_file
    lines = [] if path is None else _lines(path + ".1") + _lines(path)
    return {int(doc["batch_id"]): doc for doc in [*lines, *(recent or [])]}
