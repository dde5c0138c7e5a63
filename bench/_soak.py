"""The soak tables of ``bench/small_files.py``: a long run cut into windows of minutes.

``--sites 1000 --batches 720 --modes background --window-minutes 10`` runs an hour at a 5 s
trigger and adds a table per run with each window's batch times, produce-to-committed
p50/p99 (of the rows produced in that window) and resident memory at the window's end (does
anything grow over the hour?), then the slowest batches with where their time went (a
window's p99 is often one batch), then the live files per topic at the end.
"""

from __future__ import annotations

import math
from typing import Any

from _common import median, table


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nan when empty)."""
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def windows(r: Any, minutes: float) -> str:
    """The soak table of one run: per window of ``minutes`` after the traffic started."""
    width = minutes * 60
    end = max(r.batch_started.values(), default=r.traffic_at)
    count = max(1, math.ceil((end - r.traffic_at) / width))
    rows = []
    for w in range(count):
        lo, hi = r.traffic_at + w * width, r.traffic_at + (w + 1) * width
        batch = [r.batch_seconds[b] for b in r.measured if lo <= r.batch_started[b] < hi]
        lat = sorted(latency for ts, latency in r.latency_points if lo <= ts < hi)
        rss = [(d, c) for t, d, c in r.rss_timeline if lo <= t < hi]
        last = rss[-1] if rss else (0, 0)
        rows.append(
            [
                f"{w * minutes:g}-{(w + 1) * minutes:g}",
                len(batch),
                f"{median(batch):.2f} / {max(batch):.2f}" if batch else "-",
                f"{pct(lat, 0.5):.1f} / {pct(lat, 0.99):.1f} / {max(lat, default=0):.1f}",
                f"{last[0] / 2**20:.0f} / {last[1] / 2**20:.0f}",
                f"{max((c for _, c in rss), default=0) / 2**20:.0f}",
            ]
        )
    return table(
        [
            "minutes of traffic",
            "batches",
            "batch s p50 / max",
            "latency s p50 / p99 / max",
            "RSS MiB at end: driver / JVM+workers",
            "JVM+workers peak MiB",
        ],
        rows,
        right=(1, 2, 3, 4, 5),
    )


def end_state(r: Any) -> str:
    """Live files per topic and the share of rows in large files, at the run's end."""
    return (
        f"At the end: {r.live_files:,} live files for {r.sites:,} topics "
        f"({r.live_files / r.sites:.2f} per topic), {r.live_rows:,} rows, "
        f"{r.live_bytes / 1e6:.1f} MB; compaction wrote {r.compaction_written / 1e6:.1f} MB "
        f"for {r.ingested_bytes / 1e6:.1f} MB ingested (write amplification "
        f"{r.compaction_written / r.ingested_bytes if r.ingested_bytes else 0:.2f}); "
        f"{r.disk_files:,} files on disk."
    )


def slowest(r: Any, n: int = 5) -> str:
    """The ``n`` slowest measured batches: when, how long, where the time went (the batch
    report's phases, driver wall seconds for ``tasks`` and ``commit``, the tasks' own summed
    over partitions) and the compaction rounds that ended during each."""
    rows = []
    for b in sorted(r.measured, key=lambda b: r.batch_seconds[b], reverse=True)[:n]:
        phases = r.batch_phases.get(b, {})
        top = sorted(phases.items(), key=lambda kv: kv[1], reverse=True)[:5]
        rows.append(
            [
                b,
                f"{(r.batch_started[b] - r.traffic_at) / 60:.1f}",
                f"{r.batch_seconds[b]:.2f}",
                ", ".join(f"{k} {v:.2f}" for k, v in top) or "-",
                f"{r.compact_seconds.get(b, 0.0):.2f}",
            ]
        )
    return table(
        ["batch", "minute", "s", "phases, s (largest 5)", "compaction s during"],
        rows,
        right=(0, 1, 2, 4),
    )
