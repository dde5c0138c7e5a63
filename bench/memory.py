"""Peak memory (RSS of driver + JVM + Python workers) catching up a backlog, as it doubles.

Usage: python bench/memory.py [--messages 500000] [--max-offsets 100000] [--write-docs]

Runs the session-table pipeline (local[2], Trigger.AvailableNow, ``maxOffsetsPerTrigger``)
over a backlog of N and then 2N messages, each in a fresh child process, and samples the
resident memory of the child and all its descendants (the Spark JVM, the Python workers)
every 0.2 s. With bounded batches the peak should not depend on the backlog (target: within
20%). The default N=500k takes ~3 minutes here; the numbers in docs/benchmarks.md are for
``--messages 5000000`` (5M then 10M: ~10 minutes of pipeline time plus producing the
backlog; the broker held 4.4 GiB with 5M messages).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

SECTION = "## Memory"


def child(bootstrap: str, prefix: str, work: str, max_offsets: int) -> int:
    """Run the pipeline to the end of the backlog (inside the measured process)."""
    common.setup_env()
    from inorder.assemble import build_pipeline

    summary = build_pipeline(
        common.sessions_config(bootstrap, prefix, work, max_offsets=max_offsets)
    ).run(handle_signals=False)
    print(json.dumps({"records": summary.records}), flush=True)
    return 0


def rss_by_role(pid: int) -> dict[str, int]:
    """Resident bytes of ``pid``'s tree split into the driver (Python), the JVM, the workers."""
    import psutil

    out = {"driver": 0, "jvm": 0, "workers": 0}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            rss = p.memory_info().rss
            name = p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        role = "driver" if p.pid == pid else "jvm" if "java" in name else "workers"
        out[role] += rss
    return out


def measure(
    bootstrap: str, prefix: str, work: str, max_offsets: int
) -> tuple[int, dict[str, int], float]:
    """Peak RSS bytes of the child's process tree, peaks per role, and its wall time."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", bootstrap, prefix, work, str(max_offsets)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    peak = 0
    peaks = {"driver": 0, "jvm": 0, "workers": 0}
    while proc.poll() is None:
        now = rss_by_role(proc.pid)
        peak = max(peak, sum(now.values()))
        for role, rss in now.items():
            peaks[role] = max(peaks[role], rss)
        time.sleep(0.2)
    if proc.returncode != 0:
        raise SystemExit(f"pipeline child failed with exit code {proc.returncode}")
    return peak, peaks, time.perf_counter() - started


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--max-offsets", type=int, default=100_000)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    common.setup_env()
    command = "python bench/memory.py " + " ".join(sys.argv[1:])
    rows = []
    peaks = []
    with common.workdir("inorder-memory-") as tmp, common.broker(tmp) as bootstrap:
        for n in (args.messages, 2 * args.messages):
            prefix = f"mem-{uuid.uuid4().hex[:6]}-"
            common.simulate_backlog(bootstrap, prefix, n)
            peak, roles, wall = measure(bootstrap, prefix, f"{tmp}/{prefix}", args.max_offsets)
            peaks.append(peak)
            rows.append(
                [
                    f"{n:,}",
                    f"{args.max_offsets:,}",
                    f"{peak / 2**20:,.0f}",
                    f"{roles['driver'] / 2**20:,.0f}",
                    f"{roles['jvm'] / 2**20:,.0f}",
                    f"{roles['workers'] / 2**20:,.0f}",
                    f"{wall:.0f}",
                ]
            )
            print(rows[-1], flush=True)
    growth = peaks[1] / peaks[0] - 1
    text = (
        f"{SECTION}\n\n{common.header(command)}\n\n"
        "Session-table pipeline (`examples/sessions.toml` shape, 3 topics x 4 partitions, "
        "local[2]: the executor lives in the driver's JVM), Trigger.AvailableNow from the "
        "start of the backlog. Peak RSS of the pipeline process and all its descendants, "
        "sampled every 0.2 s; also the peak of each part: the driver's Python process, the "
        "Spark JVM (driver + executor), the Python workers together (source reads, engine "
        "tasks, data source planners).\n\n"
        + common.table(
            [
                "backlog messages",
                "maxOffsetsPerTrigger",
                "peak RSS MiB (total)",
                "driver Python",
                "JVM",
                "Python workers",
                "wall s",
            ],
            rows,
            right=(0, 1, 2, 3, 4, 5, 6),
        )
        + f"\n\nPeak growth when the backlog doubles: **{growth:+.0%}** (target within 20%: "
        f"{'met' if abs(growth) <= 0.2 else 'missed'}).\n"
    )
    print(text)
    if args.write_docs:
        common.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
