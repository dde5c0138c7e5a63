"""Spark's offsets and commits logs of a checkpoint, read through the storage layer.

* ``<spark>/offsets/<batch_id>``: written by Spark when it plans a micro-batch; the last line
  is the source's end offset (:class:`~inorder.kafka.offsets.SourceOffset` JSON): per
  topic-partition, the next offset to read after the batch. Its modification time is when
  the batch was planned.
* ``<spark>/commits/<batch_id>``: written when the batch finished; its modification time is
  when it ended.

The one reader of both logs, for local paths and S3 alike (:mod:`inorder.storage.fs`): the
ops tools, the status page and an initial state taken from another checkpoint all read it
here. Spark keeps only the newest ``spark.sql.streaming.minBatchesToRetain`` (default 100)
entries of each log.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inorder.checkpoint.names import COMMITS_DIR, OFFSETS_DIR
from inorder.errors import InorderError
from inorder.records import TopicPartition
from inorder.storage import fs as sfs


@dataclass(frozen=True, slots=True)
class SparkBatch:
    """One micro-batch of Spark's offsets log, and whether its commits log has it."""

    batch_id: int
    source: dict[str, Any]
    """The source's end offset as Spark stored it (the last line of the entry)."""
    committed: bool
    planned_at: float | None
    committed_at: float | None
    end: dict[TopicPartition, int] = field(default_factory=dict)
    """Per topic-partition, the next offset to read after the batch."""
    starts: dict[TopicPartition, int] = field(default_factory=dict)
    """Where partitions read for the first time in this batch began."""


def _positions(raw: Any) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    if not isinstance(raw, Mapping):
        return out
    for topic, parts in raw.items():
        if isinstance(parts, Mapping):
            for part, pos in parts.items():
                out[TopicPartition(str(topic), int(part))] = int(pos)
    return out


def parse_offsets_entry(text: str) -> dict[str, Any] | None:
    """The source offset on the last line of an offsets-log entry (``None``: unreadable)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or "offsets" not in data:
        return None
    return data


def _seconds(mtime: datetime | None) -> float | None:
    return None if mtime is None else mtime.timestamp()


@dataclass(frozen=True)
class SparkLog:
    """The offsets and commits logs under one Spark checkpoint directory (read-only)."""

    location: sfs.Location
    directory: str
    """The Spark checkpoint directory inside :attr:`location`'s filesystem."""

    @classmethod
    def at(cls, spark_dir: str) -> SparkLog:
        """The logs of a Spark checkpoint directory given as a path or URI."""
        location = sfs.resolve(spark_dir.rstrip("/"))
        return cls(location, location.root)

    def _ids(self, name: str) -> dict[int, float | None]:
        infos = sfs.list_files(self.location, f"{self.directory}/{name}")
        return {
            int(info.base_name): _seconds(info.mtime) for info in infos if info.base_name.isdigit()
        }

    def planned(self) -> list[int]:
        """Batch ids in the offsets log, ascending: the micro-batches planned so far."""
        return sorted(self._ids(OFFSETS_DIR))

    def committed(self) -> list[int]:
        """Batch ids in the commits log, ascending."""
        return sorted(self._ids(COMMITS_DIR))

    def entry_text(self, batch_id: int) -> str | None:
        """The text of the offsets-log entry of ``batch_id`` (``None``: not planned)."""
        path = f"{self.directory}/{OFFSETS_DIR}/{batch_id}"
        data = sfs.read_bytes_if_exists(self.location, path)
        return None if data is None else data.decode("utf-8", "replace")

    def source_offset(self, batch_id: int) -> dict[str, Any] | None:
        """The source's end offset of ``batch_id`` as Spark stored it (``None``: no entry)."""
        text = self.entry_text(batch_id)
        return None if text is None else parse_offsets_entry(text)

    def batches(self) -> list[SparkBatch]:
        """Every planned batch whose entry is readable, oldest first."""
        planned = self._ids(OFFSETS_DIR)
        commits = self._ids(COMMITS_DIR)
        out: list[SparkBatch] = []
        for batch_id in sorted(planned):
            try:
                text = self.entry_text(batch_id)
            except (OSError, InorderError):
                continue  # removed by Spark's cleanup between the listing and the read
            source = None if text is None else parse_offsets_entry(text)
            if source is None:
                continue
            out.append(
                SparkBatch(
                    batch_id=batch_id,
                    source=source,
                    committed=batch_id in commits,
                    planned_at=planned[batch_id],
                    committed_at=commits.get(batch_id),
                    end=_positions(source.get("offsets")),
                    starts=_positions(source.get("starts")),
                )
            )
        return out

    def last_committed(self) -> SparkBatch | None:
        """The newest batch Spark recorded as committed."""
        done = [b for b in self.batches() if b.committed]
        return done[-1] if done else None


__all__ = ["SparkBatch", "SparkLog", "parse_offsets_entry"]
