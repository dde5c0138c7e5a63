"""Tiered compaction over a week: the live files one output partition keeps, by simulation.

Run: ``.venv/bin/python bench/compaction_week.py [--sites 300,1000] [--buckets 32]
[--bytes-per-site-batch 243] [--files-per-batch 2] [--overhead 3100] [--trigger 5]
[--hours 1,24,168]``

No Spark and no files: the project's level planner (``plan_partition`` of
``inorder.sinks.compaction_levels``, default fan-in 9, 3 levels, 128 MiB target) is run over
an in-memory list of files, as ``simulate`` of ``tests/unit/test_compaction_levels.py`` does.

ONE output partition (a topic bucket of the ``topic_bucket`` layout, or a topic of the
per-topic layout) gets ``--files-per-batch`` level-0 files per batch, one batch every
``--trigger`` seconds. A bucket's batch holds ``sites / buckets x --bytes-per-site-batch``
bytes of data (``--bytes-per-batch`` sets it directly), each file ``--overhead`` bytes more
(the Parquet footer, which a merge pays once per output file); rows are counted in bytes of
data, so row shares are data shares. After each batch the planner runs at the batch's commit
time until it plans nothing (a merge's output may complete the next level); a merge removes
its inputs and adds ``output_pieces`` files of ``merge.level``, ``committed_at`` = its
oldest input's. Final files (level ``L`` or 3/4 of the target) are never planned again, so
they are kept out of the planner's list and only counted.

Reported per site count, layout and checkpoint (hours of simulated time): live files per
partition (and their fewest and most after any batch of the hour before: the count saws as
merges complete levels) and for the whole output (x buckets, or x sites for the per-topic
layout), the non-final ones, the share of rows in final files, the share of rows in files
that hold at most about an hour (a file's span: from its oldest rows' commit to its newest
rows' commit, <= ``--hour-span`` seconds), the largest file, write amplification (bytes
merges wrote per byte ingested, overheads included) and the most times a row was rewritten.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

from inorder.sinks.compaction_levels import (
    DEFAULT_FANOUT,
    DEFAULT_LEVELS,
    LevelSettings,
    Merge,
    output_pieces,
    plan_partition,
)

MIB = 1024 * 1024


@dataclass(eq=False, slots=True)
class File:
    """A live file as the planner sees it, and what the bench tracks of its rows."""

    level: int
    size_bytes: int
    committed_at: float
    """When its oldest rows committed (the planner's age)."""
    newest: float
    """When its newest rows committed."""
    rows: int
    """Rows, counted in bytes of data (``size_bytes - overhead``)."""
    rewrites: int
    """The most times any of its rows was rewritten."""


@dataclass
class Snapshot:
    """A partition at a checkpoint."""

    hours: float
    batches: int
    live: int
    live_range: tuple[int, int]
    """The fewest and most live files after a batch of the last hour up to here."""
    non_final: int
    final_share: float
    hour_share: float
    largest: int
    amplification: float
    max_rewrites: int


@dataclass
class Partition:
    """One output partition: its non-final files (commit-log order), its final files counted."""

    settings: LevelSettings
    overhead: int
    hour_span: float
    pending: list[File] = field(default_factory=list)
    final_files: int = 0
    final_rows: int = 0
    final_hour_rows: int = 0
    largest: int = 0
    rows_ingested: int = 0
    bytes_ingested: int = 0
    bytes_written: int = 0
    merges: int = 0
    max_rewrites: int = 0

    def add(self, f: File) -> None:
        self.largest = max(self.largest, f.size_bytes)
        self.max_rewrites = max(self.max_rewrites, f.rewrites)
        if not self.settings.is_final(f):
            self.pending.append(f)
            return
        self.final_files += 1
        self.final_rows += f.rows
        if f.newest - f.committed_at <= self.hour_span:
            self.final_hour_rows += f.rows

    def batch(self, now: float, data: int, files: int) -> None:
        """Commit one batch of ``data`` bytes of rows in ``files`` files, then compact."""
        for i in range(files):
            rows = data * (i + 1) // files - data * i // files
            f = File(0, self.overhead + rows, now, now, rows, 0)
            self.rows_ingested += rows
            self.bytes_ingested += f.size_bytes
            self.add(f)
        while merges := plan_partition(self.pending, now, self.settings):
            for merge in merges:
                self.apply(merge)

    def apply(self, merge: Merge[File]) -> None:
        taken = {id(f) for f in merge.files}
        self.pending = [f for f in self.pending if id(f) not in taken]
        rows = sum(f.rows for f in merge.files)
        pieces = output_pieces(rows + self.overhead, self.settings.target_file_size)
        committed_at = merge.committed_at
        assert committed_at is not None  # every file has a commit time here
        newest = max(f.newest for f in merge.files)
        rewrites = max(f.rewrites for f in merge.files) + 1
        self.merges += 1
        for i in range(pieces):
            part = rows * (i + 1) // pieces - rows * i // pieces
            out = File(merge.level, self.overhead + part, committed_at, newest, part, rewrites)
            self.bytes_written += out.size_bytes
            self.add(out)

    def snapshot(self, batches: int, trigger: float, live_range: tuple[int, int]) -> Snapshot:
        hour_rows = self.final_hour_rows + sum(
            f.rows for f in self.pending if f.newest - f.committed_at <= self.hour_span
        )
        total = max(self.rows_ingested, 1)
        return Snapshot(
            hours=batches * trigger / 3600,
            batches=batches,
            live=self.final_files + len(self.pending),
            live_range=live_range,
            non_final=len(self.pending),
            final_share=self.final_rows / total,
            hour_share=hour_rows / total,
            largest=self.largest,
            amplification=self.bytes_written / max(self.bytes_ingested, 1),
            max_rewrites=self.max_rewrites,
        )


def simulate(
    data_per_batch: int,
    files_per_batch: int,
    checkpoints: list[int],
    settings: LevelSettings,
    overhead: int,
    hour_span: float,
) -> tuple[list[Snapshot], float]:
    """Snapshots of one partition after each of ``checkpoints`` batches; seconds it took."""
    trigger = settings.trigger_seconds
    assert trigger is not None
    partition = Partition(settings, overhead, hour_span)
    hour = round(3600 / trigger)
    ranges = [(sys.maxsize, 0) for _ in checkpoints]
    snapshots = []
    started = time.perf_counter()
    for b in range(checkpoints[-1]):
        partition.batch(b * trigger, data_per_batch, files_per_batch)
        live = partition.final_files + len(partition.pending)
        for i, c in enumerate(checkpoints):
            if c - hour < b + 1 <= c:
                ranges[i] = (min(ranges[i][0], live), max(ranges[i][1], live))
            if b + 1 == c:
                snapshots.append(partition.snapshot(c, trigger, ranges[i]))
    return snapshots, time.perf_counter() - started


def duration(hours: float) -> str:
    if hours >= 24 and hours % 24 == 0:
        return f"{hours / 24:g} d"
    return f"{hours:g} h"


def row(sites: int, layout: str, partitions: int, s: Snapshot) -> list[object]:
    return [
        f"{sites:,}",
        layout,
        f"{partitions:,}",
        duration(s.hours),
        f"{s.batches:,}",
        s.live,
        f"{s.live_range[0]}-{s.live_range[1]}",
        f"{s.live * partitions:,}",
        s.non_final,
        f"{s.final_share:.1%}",
        f"{s.hour_share:.1%}",
        f"{s.largest / MIB:.2f}",
        f"{s.amplification:.2f}",
        s.max_rewrites,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", default="300,1000", help="site counts (comma-separated)")
    parser.add_argument("--buckets", type=int, default=32, help="topic buckets of the output")
    parser.add_argument(
        "--bytes-per-site-batch",
        type=int,
        default=243,
        help="bytes of data a site adds to a batch (243: the 300-site hour's 191 MB written in "
        "44,744 files, less 3,100 bytes of each file's footer, / 300 sites / 720 batches)",
    )
    parser.add_argument(
        "--bytes-per-batch",
        type=int,
        default=None,
        help="bytes of data per bucket and batch (default: sites / buckets x the above)",
    )
    parser.add_argument("--overhead", type=int, default=3100, help="bytes every file adds")
    parser.add_argument(
        "--files-per-batch",
        type=int,
        default=2,
        help="files a batch writes to a bucket (the soak's local[2] wrote 2: one per task)",
    )
    parser.add_argument("--trigger", type=float, default=5.0, help="seconds between batches")
    parser.add_argument("--hours", default="1,24,168", help="checkpoints, hours of batches")
    parser.add_argument("--hour-span", type=float, default=3700.0, help="an hour-sized span, s")
    parser.add_argument("--fanout", type=int, default=DEFAULT_FANOUT)
    parser.add_argument("--levels", type=int, default=DEFAULT_LEVELS)
    parser.add_argument("--target-mib", type=int, default=128)
    parser.add_argument("--no-topic", action="store_true", help="skip the per-topic layout's rows")
    args = parser.parse_args()
    command = shlex.join(["python", "bench/compaction_week.py", *sys.argv[1:]])
    settings = LevelSettings(
        args.target_mib * MIB, args.fanout, args.levels, trigger_seconds=args.trigger
    )
    hours = [float(h) for h in args.hours.split(",")]
    checkpoints = [round(h * 3600 / args.trigger) for h in hours]
    if sorted(set(checkpoints)) != checkpoints or checkpoints[0] < 1:
        parser.error("--hours must be increasing and at least one trigger long")

    def run(data: int, files: int, label: str) -> list[Snapshot]:
        snaps, took = simulate(data, files, checkpoints, settings, args.overhead, args.hour_span)
        print(f"{label}: {checkpoints[-1]:,} batches of {data:,} bytes of data in {files} "
              f"file(s) each, simulated in {took:.1f} s", flush=True)  # fmt: skip
        return snaps

    rows: list[list[object]] = []
    topic = None if args.no_topic else run(args.bytes_per_site_batch, 1, "per-topic partition")
    for sites in [int(n) for n in args.sites.split(",")]:
        data = args.bytes_per_batch
        if data is None:
            data = round(sites / args.buckets * args.bytes_per_site_batch)
        bucket = run(data, args.files_per_batch, f"{sites} sites, one of {args.buckets} buckets")
        rows += [row(sites, "topic_bucket", args.buckets, s) for s in bucket]
        rows += [row(sites, "topic", sites, s) for s in topic or []]
    table = common.table(
        [
            "sites",
            "layout",
            "partitions",
            "time",
            "batches",
            "live files / partition",
            "same, last hour min-max",
            "live files (output)",
            "non-final / partition",
            "rows in final files",
            "rows in hour-sized files",
            "largest file MiB",
            "write ampl.",
            "max rewrites / row",
        ],
        rows,
        right=(0, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13),
    )
    print(
        f"\n`{command}` on {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load average "
        f"{os.getloadavg()}; fan-in {args.fanout}, levels {args.levels}, target "
        f"{args.target_mib} MiB, trigger {args.trigger:g} s, {args.files_per_batch} file(s) "
        f"per bucket and batch, {args.overhead:,} bytes of overhead per file.\n\n{table}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
