"""Writes deterministic batches through a sink's API until killed (crash tests).

Usage: sink_crash_writer.py FORMAT PATH BATCHES ROWS [--rerun-last]

Resumes at the last committed batch + 1 (or re-runs the last committed one with
``--rerun-last``, which must be a no-op), stages each batch through two task writers
(``open_writer``), then commits it, printing ``committed N`` lines. S3 settings come from the
AWS_* environment variables.
"""

from __future__ import annotations

import random
import sys
import time

import pyarrow as pa

from inorder.sinks.delta import DeltaSink
from inorder.sinks.parquet import ParquetSink

SCHEMA = pa.schema([("topic", pa.string()), ("id", pa.int64()), ("payload", pa.string())])


def batch_rows(batch_id: int, rows: int) -> pa.RecordBatch:
    """The rows of one batch: ids batch_id*rows .. +rows (the same on every run)."""
    start = batch_id * rows
    ids = list(range(start, start + rows))
    return pa.record_batch(
        [
            pa.array(["even" if i % 2 == 0 else "odd" for i in ids]),
            pa.array(ids, pa.int64()),
            pa.array([f"row-{i}-" + "p" * 64 for i in ids]),
        ],
        schema=SCHEMA,
    )


def main() -> int:
    fmt, path, batches, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rerun_last = "--rerun-last" in sys.argv
    sink: ParquetSink | DeltaSink
    if fmt == "delta":
        sink = DeltaSink(path, partition_by=["topic"], app_id="crash-test")
    else:
        sink = ParquetSink(path, partition_by=["topic"], target_file_size=64 * 1024)
    sink.check(SCHEMA)
    print("ready", flush=True)
    last = sink.last_committed_batch()
    start = 0 if last is None else (last if rerun_last else last + 1)
    rng = random.Random()
    for batch_id in range(start, batches):
        data = batch_rows(batch_id, rows)
        files = []
        half = rows // 2
        for task, part in enumerate((data.slice(0, half), data.slice(half))):
            writer = sink.open_writer(SCHEMA, batch_id, f"task{task}")
            for chunk in pa.Table.from_batches([part]).to_batches(max_chunksize=max(1, half // 4)):
                writer.write(chunk)
                time.sleep(rng.random() * 0.005)
            files += writer.close()
        committed = sink.commit(batch_id, files)
        print(f"{'committed' if committed else 'skipped'} {batch_id}", flush=True)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
