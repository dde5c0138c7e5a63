"""Compaction planning: what one compactor round costs at many partitions of small files.

Run: ``.venv/bin/python bench/compaction_planning.py [--partitions 300,1000] [--batches 8]
[--touched 10] [--repeat 7]``

For each partition count N: a Parquet dataset on local disk written through ``ParquetSink``
(no Spark, no broker), ``--batches`` batches that each write one small file to every
partition (fewer than the fan-in, 9, so no merge is due by count, and the age windows are
set far beyond the run so none is due by age), then rounds of ``compact_parquet`` that find
nothing to merge, which is what most rounds of a running compactor do:

- ``sweep``: every partition is planned (what each round did before a round was told which
  partitions changed; a sweep still runs on start, after a failed round and every
  ``fanout`` commits);
- ``touched``: only ``--touched`` partitions are planned (a batch that wrote to those).

Each mode is timed in a process of its own. Reported: its first round (the caches of the
commit log empty, as after a restart) and the median of ``--repeat`` rounds after it, in
milliseconds. Run with an older
tree on ``PYTHONPATH`` to time its rounds: without the ``partitions`` argument only the
sweep is timed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

#: Age windows far beyond the run (trigger x fanout = 1 day): no merge is due by age.
TRIGGER_SECONDS = 86_400 / 9


def build(path: str, partitions: int, batches: int) -> float:
    """Commit ``batches`` batches of one small file per partition; seconds it took."""
    import pyarrow as pa

    from inorder.sinks.parquet import ParquetSink

    schema = pa.schema([("topic", pa.string()), ("value", pa.int64())])
    sink = ParquetSink(path, partition_by=["topic"])
    sink.check(schema)
    topics = pa.array([f"site-{i:05d}" for i in range(partitions)])
    started = time.perf_counter()
    for batch in range(batches):
        values = pa.array(range(batch * partitions, (batch + 1) * partitions), pa.int64())
        writer = sink.open_writer(schema, batch, "task0")
        writer.write(pa.record_batch([topics, values], schema=schema))
        sink.commit(batch, writer.close())
    return time.perf_counter() - started


def time_rounds(path: str, partitions: list[str] | None, repeat: int) -> tuple[float, float]:
    """Milliseconds of the first round and the median of ``repeat`` rounds after it."""
    from inorder.sinks.compaction import compact_parquet

    kwargs: dict[str, Any] = {} if partitions is None else {"partitions": partitions}
    times = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        report = compact_parquet(path, trigger_seconds=TRIGGER_SECONDS, **kwargs)
        times.append((time.perf_counter() - started) * 1000)
        if report.groups:
            raise SystemExit(f"{path}: a round merged {len(report.groups)} groups")
    return times[0], statistics.median(times[1:])


def time_in_child(path: str, partitions: list[str] | None, repeat: int) -> tuple[float, float]:
    """:func:`time_rounds` in a fresh process (nothing of the commit log cached yet)."""
    argv = [sys.executable, __file__, "--time-rounds", path, "--repeat", str(repeat)]
    if partitions is not None:
        argv += ["--only", ",".join(partitions)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    first, warm = json.loads(out.strip().splitlines()[-1])
    return float(first), float(warm)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="300,1000")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--touched", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--time-rounds", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_rounds:
        only = None if args.only is None else args.only.split(",")
        print(json.dumps(time_rounds(args.time_rounds, only, args.repeat)))
        return 0
    from inorder.sinks.compaction import compact_parquet

    touched_too = "partitions" in inspect.signature(compact_parquet).parameters
    command = "python bench/compaction_planning.py " + " ".join(sys.argv[1:])
    rows = []
    with common.workdir("inorder-compaction-planning-") as tmp:
        for n in [int(p) for p in args.partitions.split(",")]:
            path = f"{tmp}/p{n}"
            built = build(path, n, args.batches)
            modes: list[tuple[str, list[str] | None]] = [("sweep", None)]
            if touched_too:
                step = max(1, n // args.touched)
                chosen = [f"topic=site-{i:05d}" for i in range(0, n, step)][: args.touched]
                modes.append((f"touched ({len(chosen)})", chosen))
            for mode, chosen in modes:
                first, warm = time_in_child(path, chosen, args.repeat)
                rows.append([n, f"{n * args.batches:,}", mode, f"{first:.1f}", f"{warm:.1f}"])
                print(f"{n} partitions, {mode}: first {first:.1f} ms, then {warm:.1f} ms "
                      f"(built in {built:.0f} s)", flush=True)  # fmt: skip
    table = common.table(
        ["partitions", "live files", "round plans", "first round ms", "round ms (median)"],
        rows,
        right=(0, 1, 3, 4),
    )
    header = common.header(command).replace("; local noida-db broker.", " (no broker).")
    print(f"\n{header}\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
