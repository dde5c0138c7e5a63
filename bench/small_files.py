"""Small files: many sites at a short trigger, with and without compaction after each commit.

Run: ``.venv/bin/python bench/small_files.py [--sites 30,300] [--batches 20]
[--trigger "5 seconds"] [--rate-per-site 1] [--format parquet|delta]
[--modes off,background,inline] [--layouts topic,bucket] [--buckets 32] [--window-minutes 10]
[--write-docs]`` (a soak: bench/_soak.py; the layouts: bench/_layouts.py)

For each site count N and each compaction mode: N topics of one partition each (the
simulator's session traffic, one topic per site), a few messages first so every topic
exists, then the session job of ``examples/sessions.toml`` (``local[2]``, processing-time
``--trigger``, output partitioned by each of ``--layouts``, Parquet zstd or Delta) starts in a
thread while the simulator produces ``--rate-per-site`` x N messages/s in the main thread. Once
``--batches`` batches have committed after the traffic started (or at a SIGINT), the producer
is stopped (SIGINT, which the simulator handles by flushing) and so is the query.

Compaction modes: ``off``; ``background`` (``on`` is the same), the pipeline file's
``[sink] compact = true``: a Parquet sink merges in its compactor thread beside the stream,
woken by each commit with the partitions the batch wrote, and the run finishes the pending
round before it ends; ``inline``: the same merges inside the batch's commit
(``compact_in_background = False`` on the sink; Delta compacts inline in both modes). The
sink's compaction call is wrapped to time it, per batch: inline its time is inside the batch;
in the background the rounds that ended during a batch count for it, not inside its time.

Reported per run, over the measured batches (the first batch after the traffic started is
a warm-up and not measured):

- files written per batch and rows per written file (from the sink's commit log);
- live files at the end (the committed state) and files on disk (replaced files stay for
  the grace period: 1 hour for Parquet, 7 days for Delta);
- bytes ingested (the batches' files) and bytes written by compaction, their ratio (write
  amplification), and bytes compaction read;
- median and max batch time (foreachBatch, commit included), median compaction time;
- compaction rounds over the whole run (the last one finishes after the query stopped):
  how many, their total and their longest time;
- p50/p99 produce-to-committed latency: commit time (Parquet: the batch manifest's
  ``.done`` marker; Delta: the commit's timestamp) minus the row's ``kafka_ts``;
- peak RSS of the driver's process (also the producer's) and of the JVM and Python workers,
  and their CPU seconds over the run (and the cores they kept busy: CPU / wall).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common
import _layouts as layouts
import _soak as soak

SECTION = "## Small files: many sites at a 5 s trigger (issue 38)"


@dataclass
class Run:
    """What one pipeline run measured."""

    sites: int
    mode: str
    fmt: str
    layout: str = "topic"
    batch_seconds: dict[int, float] = field(default_factory=dict)
    """foreachBatch time per committed batch (compaction included)."""
    compact_seconds: dict[int, float] = field(default_factory=dict)
    """Time of the sink's compaction call, per batch."""
    rounds: list[float] = field(default_factory=list)
    """Time of every compaction call of the run (the last one after the query stopped)."""
    measured: list[int] = field(default_factory=list)
    """The batch ids measured (after the warm-up batch)."""
    batch_files: dict[int, int] = field(default_factory=dict)
    batch_rows: dict[int, int] = field(default_factory=dict)
    batch_bytes: dict[int, int] = field(default_factory=dict)
    """Per batch, read from its manifest right after its commit (the commit checkpoint
    deletes old manifests, so the log at the end holds only the newest batches)."""
    committed_at: dict[int, float] = field(default_factory=dict)
    ingested_bytes: int = 0
    compaction_written: int = 0
    compaction_read: int = 0
    compactions: int = 0
    live_files: int = 0
    live_rows: int = 0
    live_bytes: int = 0
    disk_files: int = 0
    latencies: list[float] = field(default_factory=list)
    latency_points: list[tuple[float, float]] = field(default_factory=list)
    """(produced at, produce-to-committed seconds) of every measured row."""
    batch_started: dict[int, float] = field(default_factory=dict)
    batch_phases: dict[int, dict[str, float]] = field(default_factory=dict)
    """The batch report's ``phase_seconds``, per batch."""
    rss_timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, driver RSS, JVM + workers RSS), every 0.2 s."""
    traffic_at: float = 0.0
    rss_driver: int = 0
    rss_children: int = 0
    produced: int = 0
    wall: float = 0.0
    cpu_driver: float = 0.0
    cpu_children: float = 0.0
    """CPU seconds of the driver (and producer) and of the JVM + workers over the run."""


def _note_manifest(run: Run, data: dict[str, Any]) -> None:
    """A batch manifest's files, rows and bytes."""
    batch = int(data["batch_id"])
    run.batch_files[batch] = len(data["files"])
    run.batch_rows[batch] = sum(int(f["rows"]) for f in data["files"])
    run.batch_bytes[batch] = sum(int(f["size_bytes"]) for f in data["files"])


def _disk_files(path: str) -> int:
    """Data files on disk under ``path`` (the sinks' own logs and staging excluded)."""
    count = 0
    for _base, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        count += sum(1 for n in names if n.endswith(".parquet"))
    return count


def _parquet_log(run: Run, output: str) -> dict[int, float]:
    """Fill run from a Parquet dataset's commit log; commit time per batch id."""
    from inorder.sinks.parquet_read import committed_files

    log = Path(output, "_inorder")
    commit_at: dict[int, float] = {}
    commit_at.update(run.committed_at)  # batches whose manifests were folded and deleted
    for manifest in sorted((log / "commits").glob("*.json")):
        if manifest.name.endswith(".checkpoint.json"):
            continue
        data = json.loads(manifest.read_text())
        done = manifest.with_suffix(".done")
        if not done.exists():
            continue
        batch = int(data["batch_id"])
        commit_at[batch] = float(json.loads(done.read_text())["done_at"])
        _note_manifest(run, data)
    run.ingested_bytes = sum(run.batch_bytes.values())
    for manifest in sorted((log / "compactions").glob("*.json")):
        data = json.loads(manifest.read_text())
        run.compactions += 1
        run.compaction_written += sum(int(f["size_bytes"]) for f in data["files"])
    live = committed_files(output)
    run.live_files = len(live)
    run.live_rows = sum(f.rows for f in live)
    run.live_bytes = sum(f.size_bytes for f in live)
    run.disk_files = _disk_files(output)
    return commit_at


def _delta_log(run: Run, output: str) -> dict[int, float]:
    """Fill run from a Delta table's log; commit time per batch id (the txn version)."""
    from deltalake import DeltaTable

    commit_at: dict[int, float] = {}
    for entry in sorted(Path(output, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        txn = next((a["txn"] for a in actions if "txn" in a), None)
        adds = [a["add"] for a in actions if "add" in a]
        if str(info.get("operation", "")).upper() == "OPTIMIZE":
            run.compactions += 1
            run.compaction_written += sum(int(a["size"]) for a in adds)
            continue
        if txn is None:
            continue
        batch = int(txn["version"])
        commit_at[batch] = float(info.get("timestamp", 0)) / 1000
        run.batch_files[batch] = len(adds)
        run.batch_rows[batch] = sum(
            int(json.loads(a.get("stats") or "{}").get("numRecords", 0)) for a in adds
        )
        run.ingested_bytes += sum(int(a["size"]) for a in adds)
    table = DeltaTable(output)
    actions = table.get_add_actions(flatten=True).to_pydict()
    run.live_files = len(actions["path"])
    run.live_rows = int(sum(n or 0 for n in actions.get("num_records", [])))
    run.live_bytes = int(sum(actions["size_bytes"]))
    run.disk_files = _disk_files(output)
    return commit_at


def _latencies(
    output: str, fmt: str, commit_at: dict[int, float], since: float
) -> list[tuple[float, float]]:
    """(Kafka timestamp, commit time minus it) for every row produced after ``since``, in
    order of latency."""
    import pyarrow.compute as pc

    if fmt == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(output).to_pyarrow_table(columns=["kafka_ts", "batch_id"])
    else:
        from inorder.sinks.parquet_read import read_committed

        rows = read_committed(output).select(["kafka_ts", "batch_id"])
    stamps = pc.divide(rows.column("kafka_ts").cast("int64"), 1_000_000).to_pylist()
    out = []
    for ts, batch in zip(stamps, rows.column("batch_id").to_pylist(), strict=True):
        if ts is None or ts < since or batch not in commit_at:
            continue
        out.append((ts, commit_at[batch] - ts))
    return sorted(out, key=lambda point: point[1])


def run_once(
    bootstrap: str,
    tmp: str,
    *,
    sites: int,
    mode: str,
    fmt: str,
    args: argparse.Namespace,
    layout: str = "topic",
) -> Run:
    """One pipeline run over ``sites`` fresh topics; its measurements."""
    from inorder.assemble import build_pipeline
    from inorder.pipeline.runner import PipelineRunner
    from inorder.sinks.commit_log import manifest_name

    run = Run(sites=sites, mode=mode, fmt=fmt, layout=layout)
    prefix = f"sf{sites}-{uuid.uuid4().hex[:6]}-"
    work = f"{tmp}/{prefix.rstrip('-')}"
    Path(work).mkdir(parents=True)
    # A few messages first: every topic exists before the query starts (no discovery wait).
    common.simulate_backlog(bootstrap, prefix, sites * 2, sites=sites, partitions=1)
    config = common.sessions_config(
        bootstrap, prefix, work, max_offsets=None, trigger=args.trigger, name="small-files"
    )
    config["sink"]["type"] = fmt
    config["sink"]["compact"] = mode != "off"
    layouts.apply_layout(config, layout, args.buckets)
    pipeline = build_pipeline(config)
    if mode == "inline" and fmt == "parquet":
        pipeline.sink.compact_in_background = False  # type: ignore[attr-defined]
    runner = PipelineRunner(pipeline, handle_signals=False)
    current: list[int] = [-1]
    traffic_at: list[float] = [0.0]
    producing = threading.Event()
    original = runner._make_backend

    def timed_round(seconds: float) -> None:
        run.rounds.append(seconds)
        run.compact_seconds[current[0]] = run.compact_seconds.get(current[0], 0.0) + seconds

    undo = layouts.wrap_compaction(fmt, timed_round)

    def make_backend() -> Any:
        backend = original()
        run_batch = backend.run_batch

        def timed(df: Any, batch_id: int) -> Any:
            current[0] = batch_id
            started = time.time()
            report = run_batch(df, batch_id)
            if not report.committed:
                return report
            run.batch_seconds[batch_id] = float(report.duration_seconds)
            run.batch_started[batch_id] = started
            run.batch_phases[batch_id] = dict(report.phase_seconds)
            run.committed_at[batch_id] = time.time()
            if fmt == "parquet":  # read now: the commit checkpoint deletes old manifests
                manifest = Path(work, "output", "_inorder", "commits", manifest_name(batch_id))
                _note_manifest(run, json.loads(manifest.read_text()))
            # Batches that started after the traffic did; the first of them is a warm-up.
            if traffic_at[0] and started > traffic_at[0]:
                run.measured.append(batch_id)
                if len(run.measured) == args.batches + 1 and producing.is_set():
                    producing.clear()
                    signal.raise_signal(signal.SIGINT)  # the simulator flushes and returns
            return report

        backend.run_batch = timed
        return backend

    runner._make_backend = make_backend  # type: ignore[method-assign]
    sampler = layouts.RssSampler()
    sampler.start()
    began = time.perf_counter()
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 600
        while not run.batch_seconds and time.time() < deadline and thread.is_alive():
            time.sleep(0.2)
        if not run.batch_seconds:
            raise SystemExit(f"{sites} sites: no batch committed")
        traffic_at[0] = run.traffic_at = time.time()
        producing.set()
        trigger_s = float(args.trigger.split()[0])
        # A cap only: the batch wrapper stops the producer once enough batches committed.
        cap = (args.batches + 2) * trigger_s * 6 + 60
        sim = common.simulate_backlog(
            bootstrap,
            prefix,
            0,
            sites=sites,
            partitions=1,
            rate=args.rate_per_site * sites,
            duration=cap,
        )
        producing.clear()
        run.produced = int(sim.records)
    finally:
        runner._stop.set()
        thread.join(180)
        sampler.stop()
        undo()
    run.wall = time.perf_counter() - began
    run.measured = run.measured[1 : args.batches + 1]
    output = f"{work}/output"
    commit_at = _delta_log(run, output) if fmt == "delta" else _parquet_log(run, output)
    run.latency_points = _latencies(output, fmt, commit_at, traffic_at[0] + args.trigger_warmup)
    run.latencies = [latency for _, latency in run.latency_points]
    run.rss_driver, run.rss_children = sampler.driver, sampler.children
    run.rss_timeline = sampler.timeline
    run.cpu_driver, run.cpu_children = sampler.cpu_driver, sampler.cpu_children
    return run


def line(r: Run) -> str:
    """One progress line per run."""
    m = r.measured
    files = [r.batch_files[b] for b in m if b in r.batch_files] or [0]  # the log folds batches
    return (
        f"{r.sites} sites {r.layout} compact={r.mode} ({r.fmt}): {len(m)} batches, "
        f"{statistics.mean(files):.0f} files/batch, "
        f"batch {common.median([r.batch_seconds[b] for b in m]):.2f} s, "
        f"compaction {common.median([r.compact_seconds.get(b, 0.0) for b in m]):.2f} s, "
        f"{len(r.rounds)} rounds ({sum(r.rounds):.1f} s, max {max(r.rounds, default=0):.1f}), "
        f"live {r.live_files}, disk {r.disk_files}, ingested {r.ingested_bytes / 1e6:.2f} MB, "
        f"compaction wrote {r.compaction_written / 1e6:.2f} MB, "
        f"p50/p99 {soak.pct(r.latencies, 0.5):.1f}/{soak.pct(r.latencies, 0.99):.1f} s, "
        f"RSS {r.rss_driver / 2**20:.0f}+{r.rss_children / 2**20:.0f} MiB, "
        f"CPU {r.cpu_driver:.0f}+{r.cpu_children:.0f} s, wall {r.wall:.0f} s"
    )


def report(runs: list[Run]) -> str:
    """The Markdown table."""
    rows = []
    base = {(r.sites, r.layout): r for r in runs if r.mode == "off"}
    for r in runs:
        m = r.measured
        m_logged = [b for b in m if b in r.batch_files]
        files = [r.batch_files[b] for b in m_logged]
        batch = [r.batch_seconds[b] for b in m]
        written_rows = sum(r.batch_rows[b] for b in m_logged)
        off = base.get((r.sites, r.layout))
        added = (
            common.median(batch) - common.median([off.batch_seconds[b] for b in off.measured])
            if off is not None and r is not off and off.measured
            else None
        )
        wa = r.compaction_written / r.ingested_bytes if r.ingested_bytes else 0.0
        rows.append(
            [
                r.sites,
                r.layout,
                r.fmt,
                r.mode,
                len(m),
                f"{statistics.mean(files):.0f}" if files else "-",
                f"{written_rows / sum(files):.1f}" if files else "-",
                f"{sum(r.batch_files.values()):,}",
                f"{r.live_files:,}",
                f"{r.live_rows / r.live_files:.0f}" if r.live_files else "-",
                f"{r.disk_files:,}",
                f"{r.ingested_bytes / 1e6:.2f}",
                f"{r.compaction_written / 1e6:.2f}",
                f"{wa:.1f}",
                f"{common.median(batch):.2f} / {max(batch):.2f}" if batch else "-",
                f"{common.median([r.compact_seconds.get(b, 0.0) for b in m]):.2f} / "
                f"{max((r.compact_seconds.get(b, 0.0) for b in m), default=0.0):.2f}",
                f"{len(r.rounds)} / {sum(r.rounds):.1f} / {max(r.rounds, default=0.0):.1f}",
                "-" if added is None else f"{added:+.2f}",
                f"{soak.pct(r.latencies, 0.5):.1f} / {soak.pct(r.latencies, 0.99):.1f}",
                f"{r.rss_driver / 2**20:.0f} / {r.rss_children / 2**20:.0f}",
                f"{r.cpu_driver:.0f} / {r.cpu_children:.0f} "
                f"({(r.cpu_driver + r.cpu_children) / max(r.wall, 1e-9):.2f})",
            ]
        )
    return common.table(
        [
            "sites",
            "layout",
            "format",
            "compact",
            "batches",
            "files / batch",
            "rows / written file",
            "files written (run)",
            "live files (end)",
            "rows / live file",
            "files on disk (end)",
            "MB ingested",
            "MB written by compaction",
            "write ampl.",
            "batch s p50 / max",
            "compaction s p50 / max",
            "rounds (run): n / total s / max s",
            "batch s added (p50)",
            "latency s p50 / p99",
            "peak RSS MiB driver / JVM+workers",
            "CPU s driver / JVM+workers (cores)",
        ],
        rows,
        right=(0, *range(4, 21)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", default="30,300", help="comma-separated (1000 optional)")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--trigger", default="5 seconds")
    parser.add_argument("--rate-per-site", type=float, default=1.0)
    parser.add_argument("--format", choices=("parquet", "delta"), default="parquet")
    parser.add_argument(
        "--modes", default="off,background", help="compaction modes: off, background, inline"
    )
    parser.add_argument(
        "--trigger-warmup",
        type=float,
        default=10.0,
        help="seconds of traffic left out of the latency percentiles",
    )
    parser.add_argument(
        "--window-minutes", type=float, default=0.0, help="a soak table per run (0: none)"
    )
    parser.add_argument("--layouts", default="topic", help="comma-separated: topic, bucket")
    parser.add_argument("--buckets", type=int, default=32, help="topic_buckets of `bucket`")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    common.setup_env()
    command = "python bench/small_files.py " + " ".join(sys.argv[1:])
    load_before = os.getloadavg()
    layout_list = args.layouts.split(",")
    for layout in layout_list:
        layouts.apply_layout({"sink": {}}, layout, args.buckets)  # unknown: refused at once
    runs: list[Run] = []
    with common.workdir("inorder-small-files-") as tmp, common.broker(tmp) as bootstrap:
        for sites in [int(s) for s in args.sites.split(",")]:
            for layout, mode in [(x, m) for x in layout_list for m in args.modes.split(",")]:
                mode = "background" if mode == "on" else mode
                if mode not in ("off", "background", "inline"):
                    raise SystemExit(f"--modes: unknown mode {mode!r}")
                r = run_once(
                    bootstrap, tmp, sites=sites, mode=mode, fmt=args.format, args=args,
                    layout=layout,
                )  # fmt: skip
                runs.append(r)
                # The table so far after every run: a long run cut short still reports.
                print(line(r) + "\n\n" + report(runs) + "\n", flush=True)
                if args.window_minutes:
                    print(soak.windows(r, args.window_minutes), flush=True)
                    print("\n" + soak.slowest(r), flush=True)
                    print("\n" + soak.end_state(r), flush=True)
    load = ", ".join(f"{a:.1f} {b:.1f} {c:.1f}" for a, b, c in (load_before, os.getloadavg()))
    table = report(runs)
    text = (
        f"{SECTION}\n\n{common.header(command)}\n\nLoad average (1/5/15 min) before, after: "
        f"{load}. The session job on local[2], trigger `{args.trigger}`, "
        f"{args.rate_per_site:g} message/s per site, one topic of one partition per site, "
        f"{layouts.describe(layout_list, args.buckets)}, {args.format} zstd; `compact` is the "
        "sink's compaction after each commit (target file size 128 MiB): `background` in its "
        "compactor thread, `inline` inside the commit. Per run, the first "
        f"{args.batches} batches after a warm-up batch; write amplification = bytes written "
        "by compaction / bytes the batches wrote; batch time is foreachBatch (inline "
        "compaction included); latency = batch committed (done marker / Delta commit) - Kafka "
        f"timestamp, after {args.trigger_warmup:g} s of traffic.\n\n{table}\n"
    )
    print("\n" + text)
    if args.write_docs:
        common.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
