"""What every state file holds: its schema (one row per key) and its metadata's key."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from inorder.errors import StorageError

#: Arrow schema of delta and snapshot files (one row per key).
STATE_FILE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("deleted", pa.bool_(), nullable=False),
        pa.field("state", pa.binary()),
        pa.field("last_offset", pa.int64()),
        pa.field("last_ts", pa.int64()),
        pa.field("kafka_key", pa.binary()),
        pa.field("seq", pa.int64()),
        pa.field("timer", pa.int64()),
        pa.field("timer_kind", pa.int8()),
        pa.field("ignored", pa.bool_()),
    ]
)

#: The key of the state file's metadata JSON (version, epoch, partition meta) in its schema's
#: key-value metadata (Parquet and Arrow IPC keep the schema's metadata alike).
META_KEY = b"inorder.meta"


def file_meta(table: pa.Table) -> dict[str, Any]:
    """The metadata JSON stored in a state file's schema."""
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        return {}
    loaded: dict[str, Any] = json.loads(raw)
    return loaded


@dataclass(frozen=True, slots=True)
class VersionFile:
    """One delta or snapshot file of a topic-partition."""

    version: int
    kind: str  # "delta" | "snapshot"
    path: str
    #: The attempt that wrote it: a re-run of a batch whose commit failed writes a new one,
    #: so a local cache holding the earlier attempt's content can tell it is not this file.
    attempt: str = ""
    #: In a task's delta file (state format 3, :mod:`inorder.state.task_deltas`): the
    #: topic and partition whose slice of the file this version is; ``None``: the whole file.
    part: tuple[str, int] | None = None


def damaged_file(path: str, exc: BaseException) -> StorageError:
    """The error naming a state file that cannot be read as one (``exc``: why)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StorageError(
        f"state file {path} is damaged ({reason}); restore it from a backup, or "
        "repair the checkpoint with `inorder repair PIPELINE`"
    )
