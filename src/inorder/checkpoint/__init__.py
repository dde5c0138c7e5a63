"""A pipeline's checkpoint: its layout, info file, owner lease, Spark's logs and state files.

A low floor of the package (it reads and writes through :mod:`inorder.storage` and knows the
state files of :mod:`inorder.state`): the runner, the ops tools, the archive and the status
page all reach the checkpoint through it, local or S3 alike.

* :class:`~inorder.checkpoint.layout.CheckpointLayout`: the paths under the root; built once
  where a path enters and handed down.
* :class:`~inorder.checkpoint.info.CheckpointInfo`: the info file as a typed record.
* :class:`~inorder.checkpoint.spark_log.SparkLog`: Spark's offsets and commits logs.
* :mod:`inorder.checkpoint.state_files`: a partition's state at a chosen version, read-only.
* :mod:`inorder.checkpoint.lease`: the owner lease.
"""

from __future__ import annotations

from inorder.checkpoint.info import CheckpointInfo, CheckpointInfoError
from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.spark_log import SparkBatch, SparkLog

__all__ = [
    "CheckpointInfo",
    "CheckpointInfoError",
    "CheckpointLayout",
    "SparkBatch",
    "SparkLog",
]
