"""The names of every file and directory under a pipeline's checkpoint root.

Defined once here so the runner, the ops tools and the status page agree on them; everything
else reaches them through :class:`~inorder.checkpoint.layout.CheckpointLayout`.
"""

from __future__ import annotations

#: The checkpoint's info file (its id, the pipeline identity, what ``inorder repair`` adds).
CHECKPOINT_FILE = "inorder-checkpoint.json"
#: Spark's checkpoint directory (offsets and commits logs), under the root.
SPARK_DIR = "spark"
#: Spark's offsets log, under :data:`SPARK_DIR`: one file per planned micro-batch.
OFFSETS_DIR = "offsets"
#: Spark's commits log, under :data:`SPARK_DIR`: one file per finished micro-batch.
COMMITS_DIR = "commits"
#: inorder's state checkpoint directory, under the root.
ENGINE_DIR = "engine"
#: Held (``flock``) by the run using a local checkpoint; says who holds it.
RUN_LOCK_FILE = ".inorder-run.lock"
#: Spark's log of a run on a local checkpoint (its stack traces, never on the terminal).
RUN_LOG_FILE = "inorder-run.log"
#: The owner lease, beside the info file.
LEASE_FILE = "inorder-lease.json"
#: Held only while a local lease is read and swapped (never for a whole run).
LEASE_LOCK_FILE = ".inorder-lease.lock"
#: Each batch's progress line, for the status page (local checkpoints only).
HISTORY_FILE = "inorder-batches.jsonl"
#: The readable ends the source's planner last saw while a backlog remained (local
#: checkpoints only): how a restart counts the unread offsets of a topic deleted meanwhile.
SOURCE_HIGHS_FILE = "inorder-source-highs.json"
#: Written and removed to check that a local checkpoint root is writable.
WRITE_PROBE_FILE = ".inorder-write-probe"
#: Suffix of the fresh checkpoint ``inorder repair`` builds beside the root before the swap.
REPAIR_NEW_SUFFIX = ".repair-new"
#: Infix of the backup a repair moves the old checkpoint to (``<root>.bak-<UTC time>``).
REPAIR_BACKUP_INFIX = ".bak-"

__all__ = [
    "CHECKPOINT_FILE",
    "COMMITS_DIR",
    "ENGINE_DIR",
    "HISTORY_FILE",
    "LEASE_FILE",
    "LEASE_LOCK_FILE",
    "OFFSETS_DIR",
    "REPAIR_BACKUP_INFIX",
    "REPAIR_NEW_SUFFIX",
    "RUN_LOCK_FILE",
    "RUN_LOG_FILE",
    "SOURCE_HIGHS_FILE",
    "SPARK_DIR",
    "WRITE_PROBE_FILE",
]
