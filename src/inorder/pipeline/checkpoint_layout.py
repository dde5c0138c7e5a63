"""The checkpoint's layout: its home is :mod:`inorder.checkpoint` (kept importable here for
code written against earlier releases)."""

from __future__ import annotations

from inorder.checkpoint.info import CheckpointInfoError
from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.names import (
    CHECKPOINT_FILE,
    ENGINE_DIR,
    RUN_LOCK_FILE,
    RUN_LOG_FILE,
    SPARK_DIR,
)

__all__ = [
    "CHECKPOINT_FILE",
    "ENGINE_DIR",
    "RUN_LOCK_FILE",
    "RUN_LOG_FILE",
    "SPARK_DIR",
    "CheckpointInfoError",
    "CheckpointLayout",
]
