"""How a Parquet sink's commit time grows with its live files over many batches (issue 38).

Run: ``.venv/bin/python bench/commit_growth.py [--topics 1000] [--batches 600]
[--modes off,background] [--window 100] [--rounds 1] [--vs CHECKOUT] [--profile]``

The driver's side of an hour at 1,000 sites without Spark, Kafka or state: per batch, one
tiny Parquet file per topic (``--rows`` rows, the partition column dropped as the sink's
writer does, its digest recorded) is staged under the batch's staging directory, then the
batch is committed with its offsets through :meth:`ParquetSink.commit_consumed` (manifest,
publication, staging cleanup, the compactor's wake-up, and every ``checkpoint_interval``
batches the commit checkpoint), output partitioned by topic on local disk. ``off`` keeps
every batch file live (``--batches x --topics`` of them at the end); ``background`` runs the
sink's compactor thread beside the commits (``compact=True``), as the soak did.

Per batch: the commit's wall time, the CPU of the committing thread (``thread_time``) and of
the process (the compactor thread included), and whether it wrote a commit checkpoint.
Reported per window of ``--window`` batches: live files at the window's end, commit wall s
median / p99 / max, the committing thread's CPU median, the process's CPU per batch, and the
batches that wrote a checkpoint with their commit wall time and thread CPU. Each (tree,
mode) runs in a process of its own; with ``--vs CHECKOUT`` the same runs go on that tree's
``src`` too, alternating trees within each round. ``--profile`` runs cProfile over the commits (this
tree only, one run per mode) and prints the top functions by own time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _file_bytes(rows: int) -> tuple[bytes, str]:
    """One topic's file of a batch (topic column dropped), and its rows' digest."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from inorder.sinks.proof import format_digest, table_digest

    n = rows
    table = pa.table(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "session_id": pa.array([f"s-{i % 10}" for i in range(n)]),
            "event": pa.array(["page_view"] * n),
            "value": pa.array([float(i) for i in range(n)]),
            "batch_id": pa.array([0] * n, pa.int64()),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue(), format_digest(table_digest(table))


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("session_id", pa.string()),
            ("event", pa.string()),
            ("value", pa.float64()),
            ("batch_id", pa.int64()),
        ]
    )


def measure(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process: per-batch measurements."""
    import cProfile
    import io
    import pstats

    from inorder.sinks.base import ConsumedOffsets, WrittenFile
    from inorder.sinks.parquet import ParquetSink, load_state

    work = tempfile.mkdtemp(prefix="commit-growth-", dir=args.dir)
    sink = ParquetSink(work, partition_by=["topic"], compact=mode == "background")
    sink.bind("bench")
    sink.check(_schema())
    data, digest = _file_bytes(args.rows)
    topics = [f"site-{t:04d}" for t in range(args.topics)]
    commits = Path(work, "_inorder", "commits")
    profiler = cProfile.Profile() if args.profile else None
    walls: list[float] = []
    thread_cpu: list[float] = []
    proc_cpu: list[float] = []
    checkpoints: list[int] = []
    live: dict[int, int] = {}
    for b in range(args.batches):
        staged = Path(work, "_inorder", "staging", str(b), "task-0")
        staged.mkdir(parents=True)
        files = []
        for n, topic in enumerate(topics):
            (staged / f"part-{n:05d}.parquet.staged").write_bytes(data)
            rel = f"_inorder/staging/{b}/task-0/part-{n:05d}.parquet.staged"
            files.append(WrittenFile(rel, args.rows, len(data), {"topic": topic}, None, digest))
        consumed = [ConsumedOffsets(t, 0, b * args.rows, (b + 1) * args.rows - 1) for t in topics]
        p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        assert sink.commit_consumed(b, files, consumed)
        if profiler is not None:
            profiler.disable()
        walls.append(time.perf_counter() - w0)
        thread_cpu.append(time.thread_time() - t0)
        proc_cpu.append(time.process_time() - p0)
        if (commits / f"{b:020d}.checkpoint.json").exists():
            checkpoints.append(b)
        if (b + 1) % args.window == 0 or b == args.batches - 1:
            live[b] = len(load_state(sink.location).files)  # outside the timed commit
        if args.pause:
            time.sleep(args.pause)
    if sink.compact:
        # Not waiting for the backlog: the compactor may be far behind (that is measured).
        sink.finish_background(timeout=0.0)
        result_dir = work  # removed by the parent, once this process (and its thread) ended
    else:
        shutil.rmtree(work, ignore_errors=True)
        result_dir = ""
    result: dict[str, Any] = {
        "walls": walls,
        "thread_cpu": thread_cpu,
        "proc_cpu": proc_cpu,
        "checkpoints": checkpoints,
        "live": live,
        "dir": result_dir,
    }
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
        result["profile"] = out.getvalue()
    return result


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def report(label: str, mode: str, result: dict[str, Any], window: int) -> list[str]:
    """Markdown rows: one per window of batches."""
    rows = []
    walls, tcpu, pcpu = result["walls"], result["thread_cpu"], result["proc_cpu"]
    live = {int(k): v for k, v in result["live"].items()}
    for start in range(0, len(walls), window):
        end = min(start + window, len(walls))
        w = walls[start:end]
        ck = [b for b in result["checkpoints"] if start <= b < end]
        ck_text = ", ".join(f"{b}: {walls[b]:.2f} ({tcpu[b]:.2f} CPU)" for b in ck) or "-"
        rows.append(
            f"| {label} | {mode} | {start}-{end - 1} | {live.get(end - 1, 0):,} | "
            f"{statistics.median(w):.3f} / {_p99(w):.3f} / {max(w):.3f} | "
            f"{statistics.median(tcpu[start:end]):.3f} | "
            f"{statistics.median(pcpu[start:end]):.3f} | {ck_text} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--rows", type=int, default=5, help="per topic per batch")
    parser.add_argument("--modes", default="off,background")
    parser.add_argument("--window", type=int, default=100, help="batches per reported row")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between batches")
    parser.add_argument("--dir", help="where the datasets go (default: the temp directory)")
    parser.add_argument("--vs", metavar="CHECKOUT", help="also run on that tree's src")
    parser.add_argument("--profile", action="store_true", help="cProfile the commits")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args)), flush=True)
        os._exit(0)  # the compactor thread, if any, ends with the process
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average "
          f"{os.getloadavg()}", flush=True)  # fmt: skip
    trees = [("this tree", ROOT)]
    if args.vs and not args.profile:
        trees.append((f"vs {Path(args.vs).name}", Path(args.vs).resolve()))
    passed: list[str] = []
    skip = False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a == "--vs":
            skip = True
            continue
        if not a.startswith("--vs="):
            passed.append(a)
    rows: list[str] = []
    for round_no in range(args.rounds):
        order = trees if round_no % 2 == 0 else trees[::-1]
        for mode in args.modes.split(","):
            for label, tree in order:
                env = dict(os.environ, PYTHONPATH=str(tree / "src"))
                argv = [sys.executable, __file__, *passed, "--mode", mode]
                started = time.strftime("%H:%M:%S", time.gmtime())
                out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                if result["dir"]:
                    shutil.rmtree(result["dir"], ignore_errors=True)
                if "profile" in result:
                    print(f"### profile: {mode}\n{result['profile']}", flush=True)
                new = report(
                    f"{label} (round {round_no + 1}, {started})", mode, result, args.window
                )
                print("\n".join(new), f"\nload average {os.getloadavg()}", flush=True)
                rows += new
    print(
        "\n| tree | compaction | batches | live files (end) | commit wall s p50 / p99 / max "
        "| commit thread CPU s p50 | process CPU s p50 "
        "| checkpoint batches: wall s (thread CPU s) |"
    )
    print("|---|---|---|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average "
          f"{os.getloadavg()}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
