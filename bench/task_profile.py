"""Where one engine task's time goes, per topic-partition, in one process: no Spark, no broker.

Run: ``.venv/bin/python bench/task_profile.py [--partitions 2400] [--records 10]
[--batches 6] [--top 25] [--layout bucket|topic] [--sessions 2]``

The session job's records (the simulator's model: snapshots, inserts, updates, deletes; one
topic per site, one partition each) for ``--partitions`` topic-partitions, ``--records`` per
partition per batch, are handed to the engine's task body (``run_task``, what each Spark task
of the partition backend runs) as Arrow batches of one partition each, the way the coalesced
input arrives. The state checkpoint, its cache and the staged Parquet output (partitioned by
``topic_bucket``, 32 buckets, or with ``--layout topic`` by topic) are real, in a temporary
directory; the driver's sink commit is not run (it is not the task's). The first two batches
warm up; the rest run under cProfile (not with ``--top 0``), whose table is printed with the
task's CPU microseconds per partition per batch (process CPU, one core).

Unlike a pipeline's tasks, which read their ranges from Kafka themselves and get one marker
row per partition from Spark, these get the records as rows: the per-partition work (state
open and commit, the applier, the output's encoding) is the same, the reading is not.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import sys
import tempfile
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from inorder.assemble import build_pipeline  # noqa: E402
from inorder.dev.sim_config import SimulationConfig  # noqa: E402
from inorder.dev.sim_model import SiteModel  # noqa: E402
from inorder.engine.partition import PartitionBackend  # noqa: E402
from inorder.engine.task import run_task  # noqa: E402
from inorder.kafka.consumer import SOURCE_ARROW_SCHEMA  # noqa: E402
from inorder.pipeline.config import validate  # noqa: E402
from inorder.state.store import StateOptions  # noqa: E402

#: The engine's input columns (``INPUT_EXPRS``): the source's, with the headers as JSON text.
INPUT = SOURCE_ARROW_SCHEMA.remove(SOURCE_ARROW_SCHEMA.get_field_index("headers")).append(
    pa.field("headers_json", pa.string())
)


def records(
    partitions: int, per_batch: int, batches: int, sessions: int = 2
) -> dict[tuple[str, int], list[Any]]:
    """``(key, value)`` of each topic-partition, in offset order, enough for ``batches``
    (``sessions`` sessions per topic-partition)."""
    config = SimulationConfig(
        sites=partitions,
        partitions=1,
        sessions_per_site=sessions,
        rows_per_snapshot=5,
        messages=partitions * per_batch * batches,
        seed=7,
    )
    out: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for r in SiteModel(config).records():
        out[(r.topic, zlib.crc32(r.key) % config.partitions)].append((r.key, r.value))
    return out


def batch_input(
    by_tp: dict[tuple[str, int], list[Any]], batch: int, per_batch: int
) -> list[pa.RecordBatch]:
    """The input of batch ``batch``: one Arrow batch per topic-partition, offsets in order."""
    out = []
    for (topic, partition), rows in sorted(by_tp.items()):
        start = batch * per_batch
        part = rows[start : start + per_batch]
        if not part:
            continue
        n = len(part)
        out.append(
            pa.record_batch(
                [
                    pa.array([k for k, _ in part], pa.binary()),
                    pa.array([v for _, v in part], pa.binary()),
                    pa.array([topic] * n, pa.string()),
                    pa.array([partition] * n, pa.int32()),
                    pa.array(range(start, start + n), pa.int64()),
                    pa.array(
                        [1_731_000_000_000_000 + start + i for i in range(n)],
                        INPUT.field("timestamp").type,
                    ),
                    pa.array([0] * n, pa.int32()),
                    pa.nulls(n, pa.string()),
                ],
                schema=INPUT,
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=2400)
    parser.add_argument("--records", type=int, default=10, help="per partition per batch")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--top", type=int, default=25, help="0: no profile, CPU only")
    parser.add_argument(
        "--sessions", type=int, default=2, help="sessions per topic-partition (keys of state)"
    )
    parser.add_argument(
        "--layout",
        choices=["topic", "bucket"],
        default="bucket",
        help="output partitioned by topic, or by topic_bucket (32 buckets)",
    )
    parser.add_argument(
        "--state-deltas",
        choices=["partition", "task"],
        default="task",
        help="a state delta file per topic-partition, or one per task (state format 3)",
    )
    args = parser.parse_args()
    by_tp = records(args.partitions, args.records, args.batches, args.sessions)
    work = Path(tempfile.mkdtemp(prefix="inorder-task-profile-"))
    try:
        profile_task(args, by_tp, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def profile_task(
    args: argparse.Namespace, by_tp: dict[tuple[str, int], list[Any]], work: Path
) -> None:
    """Run the batches in ``work`` and print the task's CPU and profile."""
    pipeline = build_pipeline(
        validate(
            {
                "pipeline": {"name": "profile", "checkpoint": str(work / "checkpoint")},
                "source": {"bootstrap_servers": "127.0.0.1:9", "topic_pattern": "site-.*"},
                "processor": {"type": "sessions", "options": {"row_key": "id"}},
                "integrity": {"tier": "strict", "on_violation": "restart_session"},
                "sink": {
                    "type": "parquet",
                    "path": str(work / "output"),
                    "partition_by": ["topic_bucket" if args.layout == "bucket" else "topic"],
                    "compression": "zstd",
                    **({"topic_buckets": 32} if args.layout == "bucket" else {}),
                },
            }
        )
    )
    backend = PartitionBackend(
        pipeline.processor,
        pipeline.resolved_codec(),
        pipeline.resolved_integrity(),
        checkpoint=str(work / "checkpoint" / "engine"),
        sink=pipeline.sink,
        dead_letter_sink=pipeline.dead_letter,
        state_options=StateOptions(delta_files=args.state_deltas),
    )
    backend.check()
    profile = cProfile.Profile()
    cpu = 0.0
    timed = 0
    partitions = len(by_tp)
    for batch in range(args.batches):
        spec = backend.spec(batch)
        inputs = batch_input(by_tp, batch, args.records)
        started = time.process_time()
        profiled = batch >= 2 and args.top > 0
        if profiled:
            profile.enable()
        results = list(run_task(spec, iter(inputs)))
        if profiled:
            profile.disable()
        if batch >= 2:
            cpu += time.process_time() - started
            timed += 1
        rows = sum(r.num_rows for r in results)
        print(f"batch {batch}: {sum(b.num_rows for b in inputs)} records, {rows} results")
    print(
        f"\n{partitions} topic-partitions, {args.records} records each per batch: "
        f"{cpu / max(timed, 1) / partitions * 1e6:.0f} us CPU per partition per batch "
        f"({'under cProfile, ' if args.top else ''}{timed} batches)\n"
    )
    if not args.top:
        return
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
