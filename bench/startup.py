"""Where an ``inorder run`` spends the time before its first record: a start-up timeline.

Run: ``.venv/bin/python bench/startup.py [--messages 400000] [--max-offsets 100000]
[--rounds 3] [--vs CHECKOUT]``

One backlog of simulated session traffic (the ``examples/sessions.toml`` shape: 3 sites x 4
partitions) is produced to the local broker; then ``inorder run examples/sessions.toml`` on
``local[2]`` (Trigger.AvailableNow, ``--progress json``) reads all of it, ``--rounds`` times,
alternating with the tree given by ``--vs`` (``PYTHONPATH=CHECKOUT/src``). Every 50 ms the
run's process tree is listed: when each kind of process first appears and the CPU seconds it
used. The milestones, seconds after the ``inorder run`` process started (medians):

* **JVM** launched; **session up**: the JVM starts its first Python process (Spark
  checks the workers' Python version, then looks up Python data sources), i.e. the
  SparkSession exists and the data source is being registered;
* **source planned**: the first ``plan_data_source_read`` planner process (the streaming
  source runner, ``create_data_source`` and the lookup came before it);
* **workers**: the Python worker daemon (``inorder.spark.daemon``);
* **first batch** starts (its JSON progress event time minus its duration) and **commits**;
  **exit**.

Then the CPU seconds by kind of process over the whole run, and the JVM's split by kind of
thread (``/proc/<pid>/task``: py4j's call threads, where PySpark builds the SparkContext and
session, the JIT compiler, the stream execution thread, the executor's task threads, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

ROOT = common.ROOT
MILESTONES = ("jvm", "session up", "source planned", "workers", "first batch", "commit", "exit")


def _kind(cmdline: list[str], root: int, pid: int) -> str:
    if pid == root:
        return "driver"
    text = " ".join(cmdline)
    if "java" in (cmdline[0] if cmdline else "") or text.endswith("pyspark-shell"):
        return "jvm"
    if "-m" in cmdline[:-1]:
        i = cmdline.index("-m")
        return " ".join(cmdline[i + 1 : i + 3])
    return Path(cmdline[0]).name if cmdline else "?"


_TICK = os.sysconf("SC_CLK_TCK")


def _thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of each thread of ``pid`` so far, with its name (Linux)."""
    found: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
    return found


def _by_thread_kind(threads: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by kind of JVM thread (digits in names folded: ``Thread-12`` is ``Thread-#``)."""
    kinds: dict[str, float] = {}
    for name, seconds in threads.values():
        kind = re.sub(r"\d+", "#", name)
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    return kinds


def run_once(tree: Path, bootstrap: str, prefix: str, tmp: str, max_offsets: int) -> dict[str, Any]:
    """One ``inorder run``: milestone times and CPU seconds by kind of process."""
    import psutil

    work = f"{tmp}/run-{uuid.uuid4().hex[:8]}"
    Path(work).mkdir(parents=True)
    argv = [
        sys.executable,
        "-m",
        "inorder.cli",
        *common.sessions_run_args(bootstrap, prefix, max_offsets, work),
    ]
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=work, env=env
    )
    seen: dict[int, tuple[float, str]] = {}
    cpu: dict[int, float] = {}
    jvm_threads: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                processes = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            for p in processes:
                try:
                    if p.pid not in seen:
                        seen[p.pid] = (
                            time.perf_counter() - started,
                            _kind(p.cmdline(), proc.pid, p.pid),
                        )
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
                    if seen[p.pid][1] == "jvm":
                        jvm_threads.update(_thread_cpu(p.pid))
                except psutil.Error:
                    continue
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    batches: list[tuple[float, dict[str, Any]]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{") and '"event": "batch"' in line:
            batches.append((time.perf_counter() - started, json.loads(line)))
    proc.wait()
    exited = time.perf_counter() - started
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"inorder run exited with {proc.returncode} (tree {tree})")

    def first(pred: Any) -> float:
        times = [at for at, kind in seen.values() if pred(kind)]
        return min(times) if times else float("nan")

    data = [(at, e) for at, e in batches if e.get("records")]
    at, batch = data[0] if data else (float("nan"), {"duration_seconds": float("nan")})
    by_kind: dict[str, float] = {}
    for pid, seconds in cpu.items():
        kind = seen[pid][1]
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    return {
        "jvm": first(lambda k: k == "jvm"),
        "session up": first(lambda k: k.startswith("pyspark.") or k == "python3" or "-c" in k),
        "source planned": first(lambda k: "plan_data_source_read" in k),
        "workers": first(lambda k: "spark.daemon pyspark.worker" in k),
        "first batch": at - float(batch["duration_seconds"]),
        "commit": at,
        "exit": exited,
        "cpu": by_kind,
        "jvm threads": _by_thread_kind(jvm_threads),
        "records": sum(int(e["records"]) for _, e in data),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--max-offsets", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vs", metavar="CHECKOUT", help="also run inorder from this source tree")
    args = parser.parse_args()
    common.setup_env()
    trees = [("inorder", ROOT)]
    if args.vs:
        trees.append((f"inorder ({Path(args.vs).name})", Path(args.vs).resolve()))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    load_before = os.getloadavg()
    with common.workdir("startup") as tmp, common.broker(tmp) as bootstrap:
        prefix = f"startup-{uuid.uuid4().hex[:6]}-"
        common.simulate_backlog(bootstrap, prefix, args.messages)
        for round_no in range(args.rounds):
            shift = round_no % len(trees)
            for name, tree in trees[shift:] + trees[:shift]:
                r = run_once(tree, bootstrap, prefix, tmp, args.max_offsets)
                if r["records"] != args.messages:
                    raise SystemExit(f"{name} read {r['records']} records, not {args.messages}")
                runs[name].append(r)
                marks = "  ".join(f"{m} {r[m]:.2f}" for m in MILESTONES)
                print(f"round {round_no + 1}: {name}: {marks}", flush=True)
    print(
        f"\n{args.messages:,} messages, maxOffsetsPerTrigger {args.max_offsets:,}, "
        f"{args.rounds} rounds; load average before {load_before}, after {os.getloadavg()}\n"
    )
    header = "| milestone (s after process start, medians) | " + " | ".join(runs) + " |"
    print(header)
    print("|---|" + "---:|" * len(runs))
    for m in MILESTONES:
        cells = [f"{statistics.median(r[m] for r in rs):.2f}" for rs in runs.values()]
        print(f"| {m} | " + " | ".join(cells) + " |")
    kinds = sorted({k for rs in runs.values() for r in rs for k in r["cpu"]})
    print("\n| CPU seconds by process (medians) | " + " | ".join(runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for k in [*kinds, "total"]:
        cells = []
        for rs in runs.values():
            values = [sum(r["cpu"].values()) if k == "total" else r["cpu"].get(k, 0.0) for r in rs]
            cells.append(f"{statistics.median(values):.2f}")
        print(f"| {k} | " + " | ".join(cells) + " |")
    threads = sorted(
        {k for rs in runs.values() for r in rs for k in r["jvm threads"]},
        key=lambda k: -max(r["jvm threads"].get(k, 0.0) for rs in runs.values() for r in rs),
    )
    print("\n| JVM CPU seconds by thread (medians) | " + " | ".join(runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for k in threads[:12]:
        cells = [
            f"{statistics.median(r['jvm threads'].get(k, 0.0) for r in rs):.2f}"
            for rs in runs.values()
        ]
        print(f"| {k} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
