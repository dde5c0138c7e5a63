"""A partition's checkpointed state at a chosen version: its home is
:mod:`inorder.checkpoint.state_files` (kept importable here for the ops tools' callers)."""

from __future__ import annotations

from inorder.checkpoint.state_files import (
    PartitionState,
    StoredEntry,
    load_partition_state,
    loadable_versions,
    state_partitions,
)

__all__ = [
    "PartitionState",
    "StoredEntry",
    "load_partition_state",
    "loadable_versions",
    "state_partitions",
]
