"""Latency: Kafka timestamp -> committed output, at a steady message rate with a 1 s trigger.

Usage: python bench/latency.py [--rate 1000] [--duration 60] [--trigger "1 second"] [--write-docs]

The simulator produces session traffic at ``--rate`` messages/s for ``--duration`` seconds
while the session-table pipeline runs with a processing-time trigger. Each batch's commit
time is taken when the sink commit returns; a message's latency is that time minus its Kafka
timestamp. Percentiles are over messages (one per topic/partition/offset), excluding the
first 10 s of traffic, which starts after the first batch has committed (Spark and its
Python workers up).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

SECTION = "## Latency"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    common.setup_env()
    import pyarrow.compute as pc

    from inorder.assemble import build_pipeline
    from inorder.pipeline.runner import PipelineRunner
    from inorder.sessions.rebuild import read_changes

    command = "python bench/latency.py " + " ".join(sys.argv[1:])
    with common.workdir("inorder-latency-") as tmp, common.broker(tmp) as bootstrap:
        prefix = f"lat-{uuid.uuid4().hex[:6]}-"
        # Topics exist before the query starts (a few messages), so discovery is not measured.
        common.simulate_backlog(bootstrap, prefix, 100)
        config = common.sessions_config(
            bootstrap, prefix, tmp, max_offsets=None, trigger=args.trigger, name="latency"
        )
        runner = PipelineRunner(build_pipeline(config), handle_signals=False)
        commits: dict[int, float] = {}
        durations: dict[int, float] = {}
        original = runner._make_backend

        def make_backend() -> Any:
            backend = original()
            run_batch = backend.run_batch

            def timed(df: Any, batch_id: int) -> Any:
                report = run_batch(df, batch_id)
                commits[batch_id] = time.time()
                durations[batch_id] = float(report.duration_seconds)
                return report

            backend.run_batch = timed
            return backend

        runner._make_backend = make_backend  # type: ignore[method-assign]
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        # Traffic starts once the first batch has committed: Spark and its Python workers
        # are up, so start-up (see "End to end") is not counted as latency.
        deadline = time.time() + 300
        while not commits and time.time() < deadline:
            time.sleep(0.2)
        started = time.time()
        common.simulate_backlog(
            bootstrap, prefix, 0, rate=args.rate, duration=args.duration, sessions_per_site=40
        )
        time.sleep(5)  # let the last messages through
        runner._stop.set()
        thread.join(120)
        changes = read_changes(f"{tmp}/output")
    ts = changes.column("kafka_ts")
    keys = changes.select(["topic", "partition", "offset", "batch_id"]).to_pylist()
    stamps = pc.divide(ts.cast("int64"), 1_000_000).to_pylist()
    seen: dict[tuple[str, int, int], float] = {}
    for k, t in zip(keys, stamps, strict=True):
        tp = (k["topic"], k["partition"], k["offset"])
        if tp in seen or t is None or t < started + args.warmup or k["batch_id"] not in commits:
            continue
        seen[tp] = commits[k["batch_id"]] - t
    lat = sorted(seen.values())
    if not lat:
        print("no messages measured")
        return 1

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    measured = sorted({k["batch_id"] for k in keys if k["batch_id"] in commits})
    measured = [b for b in measured if commits[b] >= started + args.warmup]
    gaps = [commits[b] - commits[a] for a, b in itertools.pairwise(measured)]
    batch_note = (
        f"{len(measured)} batches after the warm-up; median foreachBatch time "
        f"{common.median([durations[b] for b in measured]):.2f} s, median time between "
        f"commits {common.median(gaps):.2f} s."
    )

    rows = [
        [
            f"{args.rate:,.0f}",
            args.trigger,
            f"{len(lat):,}",
            f"{pct(0.5):.2f}",
            f"{pct(0.99):.2f}",
            f"{lat[-1]:.2f}",
        ]
    ]
    text = (
        f"{SECTION}\n\n{common.header(command)}\n\n"
        "Session-table pipeline on local[2] while the simulator produces at a steady rate; "
        "latency = batch commit time (sink commit returned) - Kafka timestamp, per message, "
        f"after a {args.warmup:g} s warm-up.\n\n"
        + common.table(
            ["msg/s", "trigger", "messages", "p50 s", "p99 s", "max s"], rows, right=(0, 2, 3, 4, 5)
        )
        + f"\n\n{batch_note}\n\nTarget p50 < 2 s: **{'met' if pct(0.5) < 2 else 'missed'}** "
        f"(p50 {pct(0.5):.2f} s).\n"
    )
    print(text)
    if args.write_docs:
        common.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
