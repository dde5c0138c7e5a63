"""Staging and committing one batch's output over many topic-partitions: per partition or per task.

Run: ``.venv/bin/python bench/output_staging.py [--topics 300] [--partitions 4] [--rows 42]
[--tasks 2] [--batches 4] [--rounds 2] [--vs CHECKOUT]``

The sink's side of ``bench/partitions.py``'s 1,200 topic-partitions, without Spark, Kafka or
state: per batch, each topic-partition's rows (``--rows``, session-like columns) are staged
through :meth:`ParquetSink.open_writer` (Parquet zstd, partitioned by topic), then the batch
is committed with its offsets (:meth:`ParquetSink.commit_consumed`: manifest, publication,
staging cleanup). ``per tp`` opens one writer per topic-partition (the engine before files
per task); ``per task`` opens one writer per task (``--tasks``, whole topics dealt round
them), each holding one file per topic. Each contender runs in a process of its own; with
``--vs CHECKOUT`` ``per tp`` runs on that tree's sink (its staging layout) and ``per task``
on this one's, alternating for ``--rounds``; without, both on this tree.

Reported per run, medians over the batches after the first: staged files per batch, CPU
(the process's user + system) and wall seconds of staging and of the commit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _rows(topic: int, partition: int, batch: int, n: int) -> Any:
    import pyarrow as pa

    ts = pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.int64())
    return pa.RecordBatch.from_pydict(
        {
            "topic": pa.array([f"site-{topic:04d}"] * n),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(batch * n, batch * n + n), pa.int64()),
            "session_id": pa.array([f"s-{topic}-{partition}-{i % 10}" for i in range(n)]),
            "event": pa.array(["page_view"] * n),
            "value": pa.array([float(i) for i in range(n)]),
            "ts": ts.cast(pa.timestamp("us", tz="UTC")),
            "batch_id": pa.array([batch] * n, pa.int64()),
        }
    )


def measure(mode: str, args: argparse.Namespace) -> str:
    """One run in this process: the result line."""
    from inorder.sinks.base import ConsumedOffsets
    from inorder.sinks.parquet import ParquetSink

    tps = [(t, p) for t in range(args.topics) for p in range(args.partitions)]
    work = tempfile.mkdtemp(prefix="output-staging-")
    sink = ParquetSink(work, partition_by=["topic"])
    sink.bind("bench")
    per: list[tuple[int, float, float, float, float]] = []
    for b in range(args.batches):
        data = {tp: _rows(*tp, b, args.rows) for tp in tps}
        if b == 0:
            sink.check(next(iter(data.values())).schema)
        schema = next(iter(data.values())).schema
        cpu, wall = time.process_time(), time.perf_counter()
        files = []
        if mode == "tp":
            for (t, p), rows in data.items():
                w = sink.open_writer(schema, b, f"site-{t:04d}-{p}-{uuid.uuid4().hex[:12]}")
                w.write(rows)
                files += w.close()
        else:
            for k in range(args.tasks):
                w = sink.open_writer(schema, b, f"task-{uuid.uuid4().hex[:12]}")
                for (t, _), rows in data.items():
                    if t % args.tasks == k:
                        w.write(rows)
                files += w.close()
        staged_cpu, staged_wall = time.process_time() - cpu, time.perf_counter() - wall
        consumed = [
            ConsumedOffsets(f"site-{t:04d}", p, b * args.rows, (b + 1) * args.rows - 1)
            for t, p in tps
        ]
        cpu, wall = time.process_time(), time.perf_counter()
        assert sink.commit_consumed(b, files, consumed)
        per.append(
            (len(files), staged_cpu, staged_wall, time.process_time() - cpu,
             time.perf_counter() - wall)
        )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    steady = per[1:] or per

    def med(i: int) -> float:
        return statistics.median(r[i] for r in steady)

    ms = 1e3 / len(tps)
    return (
        f"per {mode:<4} files/batch {med(0):5.0f}  stage cpu {med(1):6.2f} s wall {med(2):6.2f} s"
        f"  commit cpu {med(3):5.2f} s wall {med(4):5.2f} s  per tp: stage {med(1) * ms:.2f} ms"
        f" cpu, commit {med(3) * ms:.2f} ms cpu / {med(4) * ms:.2f} ms wall"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=300)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rows", type=int, default=42, help="per topic-partition per batch")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vs", metavar="CHECKOUT", help="run 'per tp' on this tree's sink")
    parser.add_argument("--mode", choices=("tp", "task"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(measure(args.mode, args), flush=True)
        return 0
    print(f"load average before: {os.getloadavg()}", flush=True)
    trees = {"tp": Path(args.vs).resolve() if args.vs else ROOT, "task": ROOT}
    passed = [a for a in sys.argv[1:] if not a.startswith("--vs") and a != args.vs]
    for round_no in range(args.rounds):
        order = ("tp", "task") if round_no % 2 == 0 else ("task", "tp")
        for mode in order:
            env = dict(os.environ, PYTHONPATH=str(trees[mode] / "src"))
            argv = [sys.executable, __file__, *passed, "--mode", mode]
            subprocess.run(argv, env=env, check=True)
    print(f"load average after: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
