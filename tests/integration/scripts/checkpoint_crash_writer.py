"""Writes batches through ParquetSink with frequent commit checkpoints, dying mid-checkpoint.

Usage: checkpoint_crash_writer.py PATH BATCHES ROWS DIE_AT

Resumes after the last committed batch (re-running that one first, which must be a no-op),
checkpoints every 3 batches keeping 2 batches of manifests, compacts every 4 batches (every
non-final file: ``full``), and
SIGKILLs itself right before the DIE_AT-th filesystem step of checkpoint writing or cleanup
(0: never). Prints ``ready`` once the sink is checked (for kills from outside). S3
settings come from the AWS_* environment variables.
"""

from __future__ import annotations

import os
import signal
import sys
import types
from pathlib import Path
from typing import Any

from inorder.sinks import commit_checkpoint
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import ParquetSink
from inorder.storage import fs as sfs

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tests.*
from tests.fixtures.sink_cases import ID_SCHEMA, id_batch, stage_batch


def dying_fs(die_at: int) -> types.SimpleNamespace:
    """``inorder.storage.fs`` whose put_if_absent / delete_quietly kill the process at step n."""
    steps = {"n": 0}

    def step(real: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            steps["n"] += 1
            if steps["n"] == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        return wrapped

    names = {name: getattr(sfs, name) for name in dir(sfs) if not name.startswith("__")}
    names["put_if_absent"] = step(sfs.put_if_absent)
    names["delete_quietly"] = step(sfs.delete_quietly)
    return types.SimpleNamespace(**names)


def main() -> int:
    path, batches, rows, die_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if die_at:
        setattr(commit_checkpoint, "sfs", dying_fs(die_at))  # noqa: B010
    sink = ParquetSink(path, partition_by=["topic"], checkpoint_interval=3, manifest_retention=2)
    sink.check(ID_SCHEMA)
    print("ready", flush=True)
    last = sink.last_committed_batch()
    start = 0 if last is None else last
    for batch_id in range(start, batches):
        files = stage_batch(sink, batch_id, id_batch(batch_id, rows), key="task")
        committed = sink.commit(batch_id, files)
        if committed != (last is None or batch_id != last):
            print(f"batch {batch_id}: commit returned {committed}", file=sys.stderr)
            return 1
        if batch_id % 4 == 3:
            compact_parquet(path, grace_seconds=0, full=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
