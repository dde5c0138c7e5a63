"""Writes batches through ParquetSink with frequent commit checkpoints, dying mid-checkpoint.

Usage: checkpoint_crash_writer.py PATH BATCHES ROWS DIE_AT

Resumes after the last committed batch (re-running that one first, which must be a no-op),
checkpoints every 3 batches keeping 2 batches of manifests, compacts every 4 batches, and
SIGKILLs itself right before the DIE_AT-th filesystem step of checkpoint writing or cleanup
(0: never). Prints ``ready`` once the sink is checked (for kills from outside). S3
settings come from the AWS_* environment variables.
"""

from __future__ import annotations

import os
import signal
import sys
import types
from typing import Any

import pyarrow as pa

from inorder.sinks import commit_checkpoint
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import ParquetSink
from inorder.storage import fs as sfs

SCHEMA = pa.schema([("topic", pa.string()), ("batch_id", pa.int64()), ("id", pa.int64())])


def batch_rows(batch_id: int, rows: int) -> pa.RecordBatch:
    """Rows of one batch: ids batch_id*rows .. +rows (the same on every run)."""
    ids = list(range(batch_id * rows, (batch_id + 1) * rows))
    return pa.record_batch(
        [
            pa.array(["even" if i % 2 == 0 else "odd" for i in ids]),
            pa.array([batch_id] * rows, pa.int64()),
            pa.array(ids, pa.int64()),
        ],
        schema=SCHEMA,
    )


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
    sink.check(SCHEMA)
    print("ready", flush=True)
    last = sink.last_committed_batch()
    start = 0 if last is None else last
    for batch_id in range(start, batches):
        data = batch_rows(batch_id, rows)
        files = []
        for task, part in enumerate((data.slice(0, rows // 2), data.slice(rows // 2))):
            writer = sink.open_writer(SCHEMA, batch_id, f"task{task}")
            writer.write(part)
            files += writer.close()
        committed = sink.commit(batch_id, files)
        if committed != (last is None or batch_id != last):
            print(f"batch {batch_id}: commit returned {committed}", file=sys.stderr)
            return 1
        if batch_id % 4 == 3:
            compact_parquet(path, grace_seconds=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
