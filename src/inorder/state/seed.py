"""Seeding a new checkpoint's state: keys and states loaded from elsewhere, as version -1.

Micro-batch ``B`` loads the newest state version below ``B``, so a snapshot at version
``-1`` is what batch 0 (and every later batch, through the deltas) starts from. The
partition's progress is set to ``start_offset - 1``: records below the offset the seeded
state corresponds to count as already applied (replays), never as new input.

Seeding is only meant for a checkpoint no batch has run on; writing the same seed again
(a restart before the first batch) rewrites the same file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inorder.records import TopicPartition
from inorder.state.cache import Row, entry_row
from inorder.state.checkpoint import CheckpointStore
from inorder.state.entry import KeyEntry, PartitionMeta
from inorder.state.state_table import table_of_rows

#: The state version a seed is written as: below batch 0.
SEED_VERSION = -1


def seed_partition_state(
    checkpoint: CheckpointStore,
    tp: TopicPartition,
    entries: Iterable[tuple[str, KeyEntry]],
    state_codec: Any,
    start_offset: int,
    epoch: str,
) -> int:
    """Write ``entries`` as the version -1 snapshot of ``tp``; return the number of keys.

    ``state_codec`` encodes the states (``inorder.state.codec.StateCodec`` of the state type);
    ``start_offset`` is the first offset the pipeline will read for ``tp``; ``epoch`` is the
    checkpoint's state epoch (``CheckpointStore.state_meta()["epoch"]``).
    """
    encode = state_codec.encode
    rows: list[tuple[str, Row]] = []
    for key, entry in sorted(entries, key=lambda kv: kv[0]):
        state = None if entry.state is None else encode(entry.state)
        rows.append((key, entry_row(entry, state)))
    meta = PartitionMeta(last_offset=start_offset - 1)
    doc = {"version": SEED_VERSION, "epoch": epoch, "meta": meta.to_json()}
    checkpoint.write_table(tp, SEED_VERSION, "snapshot", table_of_rows(rows, [], doc))
    return len(rows)


def has_state(checkpoint: CheckpointStore, tps: Iterable[TopicPartition]) -> bool:
    """Whether any of ``tps`` has a state version at or above batch 0 (a used checkpoint)."""
    return any(f.version >= 0 for tp in tps for f in checkpoint.versions(tp))
