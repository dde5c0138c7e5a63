"""CPU per record of the session job end to end: inorder, the one-process limit, vanilla PySpark.

Run: ``.venv/bin/python bench/cpu_per_record.py [--messages 400000] [--max-offsets 100000]
[--rounds 5] [--skip-vanilla] [--vs CHECKOUT] [--with-quix] [--with-tables]``

Quick check (~3 minutes on 2 shared cores): ``--messages 100000 --max-offsets 25000 --rounds 2
--skip-vanilla``. The defaults take 10-15 minutes here.

One backlog of simulated session traffic (3 sites x 4 partitions, no faults: the
``examples/sessions.toml`` shape) is produced once to the local broker; then every contender
reads all of it, each run in its own fresh process tree, the contenders alternating (the
order rotates every round):

* **inorder**: ``inorder run examples/sessions.toml`` on ``local[2]`` with Trigger.AvailableNow,
  ``maxOffsetsPerTrigger`` = ``--max-offsets``, the Parquet (zstd) sink, ``--progress json``;
* **inorder (CHECKOUT)** with ``--vs CHECKOUT``: the same, run from another source tree
  (``PYTHONPATH=CHECKOUT/src``, which the JVM hands on to its Python workers); the driver
  prints ``inorder.__file__`` and every Python process's ``PYTHONPATH`` is checked, so a run
  that imported the wrong tree stops the benchmark;
* **inorder+tables** with ``--with-tables``: the same run keeping both session tables
  (``[tables]`` current and history, Delta, beside the output): what the tables add to a batch;
* **limit**: one Python process doing the whole job: a confluent-kafka consumer over every
  partition, msgspec decode, the same session processor with dict state, pyarrow Parquet
  (zstd) writes of the same change rows (``pure_python_rate`` of ``bench/e2e_throughput.py``);
* **vanilla PySpark**: the same source, ``groupBy(session).applyInPandasWithState`` and Spark's
  Parquet writer (``bench/vanilla_sessions.py``), same batch sizes, PySpark's own worker
  daemon (as a PySpark user runs it; ``--skip-vanilla`` leaves it out);
* **quix** with ``--with-quix``: Quix Streams, exactly-once, the same processor with its state
  in Quix state, a checkpoint (one Parquet file) every ``--max-offsets`` messages
  (``bench/quix_sessions.py``, from its own virtualenv: ``bench/_quix.py``). After every round
  its change rows are checked equal to inorder's (the benchmark stops at a difference).

CPU is user + system seconds of every process of the tree (the driver, the Spark JVM, every
Python worker and daemon, the data source planner processes): this process makes itself the
reaper of orphaned descendants and reads its ``RUSAGE_CHILDREN`` once the whole tree has
exited and been reaped, so processes that exit early or are orphaned are counted too. The
tree is also sampled every 0.2 s with psutil (the last times of each pid; a lower bound) to
split the CPU by process role. The broker's CPU over the run (``delta`` of its process times)
is added to the total and printed separately. Wall rate: messages / seconds from the process
start to its exit (start-up included). Start-up: for inorder, process start to the start of
the first data batch (the first batch's JSON progress event time minus its duration; the
runner reports every 0.5 s, so +-0.5 s), and to its commit; for vanilla the same from Spark's
progress; for the limit, the process time outside its read loop (imports, connecting); for
quix, process start to its first message, and to its first checkpoint's sink flush.
Per contender the medians over ``--rounds`` runs are printed, with the limit's and vanilla's
CPU per record over the contender's (1.0 = as cheap as the limit; above 1 for vanilla = cheaper
than vanilla).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common
import _process_tree as process_tree
import _quix as quix

ROOT = common.ROOT

# Runs `inorder run ...` after printing which inorder it imported (the driver's view).
DRIVER = (
    "import json, sys\n"
    "import inorder\n"
    "print(json.dumps({'event': 'bench_module', 'file': inorder.__file__}), flush=True)\n"
    "from inorder.cli import main\n"
    "sys.argv = ['inorder', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)


# -- the contenders' processes ----------------------------------------------------------------


def child_limit(bootstrap: str, prefix: str, out: str, total: int) -> int:
    """The limit, inside the measured process."""
    from e2e_throughput import pure_python_rate, topic_partitions

    tps = topic_partitions(bootstrap, prefix)
    Path(out).mkdir(parents=True, exist_ok=True)
    cpu = time.process_time()
    rate = pure_python_rate(bootstrap, tps, total, out)
    cpu = time.process_time() - cpu
    print(
        json.dumps({"event": "limit", "rate": rate, "loop_seconds": total / rate, "loop_cpu": cpu}),
        flush=True,
    )
    return 0


def child_vanilla(bootstrap: str, prefix: str, work: str, total: int, max_offsets: int) -> int:
    """Vanilla PySpark, inside the measured process."""
    common.setup_env()
    from vanilla_sessions import progress_of, start_vanilla

    from inorder.pipeline.spark import build_spark_session

    spark = build_spark_session(
        "local[2]", "vanilla", conf={"spark.python.daemon.module": "pyspark.daemon"}
    )
    query = start_vanilla(
        spark,
        bootstrap,
        f"{prefix}.*",
        f"{work}/output",
        f"{work}/checkpoint",
        max_offsets=max_offsets,
    )
    query.awaitTermination()
    progress = progress_of(query)
    rows = sum(int(p["numInputRows"]) for p in progress)
    data = [p for p in progress if int(p["numInputRows"]) > 0]
    print(
        json.dumps(
            {
                "event": "vanilla",
                "records": rows,
                # Each data batch: its start (Unix time), its seconds, its records.
                "batches": [
                    [
                        _epoch(p["timestamp"]),
                        float(p["durationMs"]["triggerExecution"]) / 1000,
                        int(p["numInputRows"]),
                    ]
                    for p in data
                ],
            }
        ),
        flush=True,
    )
    spark.stop()
    return 0 if rows == total else 1


# -- one measured run -------------------------------------------------------------------------


def _events(lines: list[tuple[float, str]]) -> list[tuple[float, dict[str, Any]]]:
    out = []
    for at, line in lines:
        if line.startswith("{"):
            try:
                out.append((at, json.loads(line)))
            except ValueError:
                continue
    return out


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def run_contender(
    kind: str,
    tree: Path,
    *,
    bootstrap: str,
    prefix: str,
    tmp: str,
    total: int,
    max_offsets: int,
    broker: int | None,
    exclude: list[int],
) -> dict[str, Any]:
    """Run one contender in a fresh process tree; its CPU, broker CPU, wall and start-up."""
    work = f"{tmp}/{kind.split()[0]}-{uuid.uuid4().hex[:8]}"
    Path(work).mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), TMPDIR=work)
    here = str(Path(__file__).resolve())
    if kind.startswith("inorder"):
        argv = [
            sys.executable,
            "-c",
            DRIVER,
            *common.sessions_run_args(bootstrap, prefix, max_offsets, work),
        ]
        if kind == "inorder+tables":
            argv += ["--set", f"tables.current={work}/current"]
            argv += ["--set", f"tables.history={work}/history"]
    elif kind == "limit":
        argv = [sys.executable, here, "--child", "limit", bootstrap, prefix, f"{work}/out"]
        argv.append(str(total))
    elif kind == "quix":
        argv = quix.argv(quix.venv_python(tree), bootstrap, prefix, work, total, max_offsets)
    else:
        argv = [sys.executable, here, "--child", "vanilla", bootstrap, prefix, work]
        argv += [str(total), str(max_offsets)]
    if broker:
        process_tree.wait_idle(broker)
    broker_before = process_tree.tree_cpu_seconds(broker) if broker else 0.0
    run = process_tree.run_tree(
        argv, env=env, cwd=work, stderr_path=f"{work}.stderr", exclude_pgids=exclude
    )
    broker_cpu = process_tree.tree_cpu_seconds(broker) - broker_before if broker else float("nan")
    if run.returncode != 0:
        tail = Path(f"{work}.stderr").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{kind} exited with {run.returncode}; stderr ends:\n{tail}")
    events = _events(run.lines)
    result: dict[str, Any] = {
        "kind": kind,
        "wall": run.wall,
        "tree_wall": run.tree_wall,
        "cpu": run.cpu,
        "sampled": run.sampled,
        "lost": run.lost,
        "exact": run.exact,
        "broker": broker_cpu,
        "by_role": run.by_role,
        "processes": run.processes,
        "startup": float("nan"),
        "first_commit": float("nan"),
        "steady_us": float("nan"),
        "steady_rate": float("nan"),
        "load": os.getloadavg()[0],
        "output": f"{work}/out" if kind == "limit" else f"{work}/output",
    }
    if kind.startswith("inorder"):
        module = next((e["file"] for _, e in events if e.get("event") == "bench_module"), "")
        want = (tree / "src").resolve()
        if not Path(module).resolve().is_relative_to(want):
            raise SystemExit(f"{kind}: the driver imported {module}, not a module under {want}")
        stray = [p for p in run.python_paths if str(tree / "src") not in p.split(os.pathsep)]
        if stray:
            raise SystemExit(f"{kind}: Python processes ran with PYTHONPATH {stray}")
        result["module"] = module
        result["python_paths"] = run.python_paths
        batches = [(at, e) for at, e in events if e.get("event") == "batch" and e["records"] > 0]
        summary = next((e for _, e in events if e.get("event") == "summary"), None)
        records = int(summary["records"]) if summary else sum(e["records"] for _, e in batches)
        if records != total:
            raise SystemExit(f"{kind} read {records} records, expected {total}")
        result["batches"] = len(batches)
        if batches:
            at, first = batches[0]
            result["startup"] = at - float(first["duration_seconds"])
            result["first_commit"] = at
        commits = [(at, int(e["records"])) for at, e in batches]
        _steady(result, run.series, commits)
    elif kind == "limit":
        loop = next(e for _, e in events if e.get("event") == "limit")
        result["startup"] = run.wall - float(loop["loop_seconds"])
        result["batches"] = 1
        result["steady_us"] = float(loop["loop_cpu"]) / total * 1e6
        result["steady_rate"] = float(loop["rate"])
    elif kind == "quix":
        info = quix.summary([e for _, e in events], run.start_epoch, total)
        for key in ("startup", "first_commit", "batches"):
            result[key] = info[key]
        _steady(result, run.series, info["commits"])
    else:
        info = next(e for _, e in events if e.get("event") == "vanilla")
        if info["records"] != total:
            raise SystemExit(f"{kind} read {info['records']} records, expected {total}")
        ends = [(b[0] - run.start_epoch + b[1], int(b[2])) for b in info["batches"]]
        if ends:
            result["startup"] = info["batches"][0][0] - run.start_epoch
            result["first_commit"] = ends[0][0]
        result["batches"] = len(ends)
        _steady(result, run.series, ends)
    return result


def _steady(
    result: dict[str, Any], series: list[tuple[float, float]], commits: list[tuple[float, int]]
) -> None:
    """CPU per record and records/s from the first batch's commit to the last one's."""
    if len(commits) < 2:
        return
    (first, _), (end, _) = commits[0], commits[-1]
    records = sum(n for _, n in commits[1:])
    cpu = process_tree.cpu_at(series, end) - process_tree.cpu_at(series, first)
    result["steady_us"] = cpu / records * 1e6
    result["steady_rate"] = records / (end - first) if end > first else float("nan")


def _line(r: dict[str, Any], total: int) -> str:
    us = (r["cpu"] + (r["broker"] if r["broker"] == r["broker"] else 0.0)) / total * 1e6
    roles = ", ".join(
        f"{k} {v:.1f}" for k, v in sorted(r["by_role"].items(), key=lambda kv: -kv[1])[:6]
    )
    return (
        f"{r['kind']:<22} {us:6.1f} us/rec (tree {r['cpu'] / total * 1e6:.1f}, broker "
        f"{r['broker'] / total * 1e6:.1f}; {r['cpu']:.1f} s, sampled {r['sampled']:.1f}, "
        f"unaccounted {r['lost']:.1f}) "
        f"{total / r['wall']:>9,.0f} msg/s  wall {r['wall']:.1f} s  start-up "
        f"{r['startup']:.1f} s  first commit {r['first_commit']:.1f} s  "
        f"steady {r['steady_us']:.1f} us/rec {r['steady_rate']:,.0f} msg/s  "
        f"{r['processes']} procs  load {r['load']:.1f}  [{roles}]"
    )


# -- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--max-offsets", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-vanilla", action="store_true")
    parser.add_argument(
        "--with-quix", action="store_true", help="also run Quix Streams (its own virtualenv)"
    )
    parser.add_argument(
        "--vs",
        metavar="CHECKOUT",
        action="append",
        default=[],
        help="also run the inorder contender from this source tree (repeatable)",
    )
    parser.add_argument(
        "--with-tables",
        action="store_true",
        help="also run inorder keeping both session tables (current and history, Delta)",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "limit":
            return child_limit(rest[0], rest[1], rest[2], int(rest[3]))
        return child_vanilla(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]))

    common.setup_env()
    if not process_tree.set_child_subreaper():
        print("warning: no subreaper; CPU is the sampled lower bound", flush=True)
    contenders: list[tuple[str, Path]] = [("inorder", ROOT)]
    for checkout in args.vs:
        other = Path(checkout).resolve()
        if not (other / "src" / "inorder").is_dir():
            parser.error(f"--vs: {other}/src/inorder is not a directory")
        contenders.append((f"inorder ({other.name})", other))
    if args.with_tables:
        contenders.append(("inorder+tables", ROOT))
    contenders.append(("limit", ROOT))
    if args.with_quix:
        quix.ensure_venv(ROOT)
        contenders.append(("quix", ROOT))
    if not args.skip_vanilla:
        contenders.append(("vanilla", ROOT))
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in contenders}
    loads = [os.getloadavg()]
    with common.workdir("inorder-cpu-") as tmp, common.broker(tmp) as bootstrap:
        broker = process_tree.broker_pid(tmp, bootstrap)
        exclude = [os.getpgid(broker)] if broker else []
        if broker:
            idle_before = process_tree.tree_cpu_seconds(broker)
            time.sleep(5)
            idle = (process_tree.tree_cpu_seconds(broker) - idle_before) / 5
            print(f"broker pid {broker}: {idle * 1000:.1f} ms CPU per second while idle")
        prefix = f"cpu-{uuid.uuid4().hex[:6]}-"
        started = time.perf_counter()
        total = int(common.simulate_backlog(bootstrap, prefix, args.messages).records)
        print(f"produced {total:,} messages in {time.perf_counter() - started:.1f} s", flush=True)
        for round_no in range(args.rounds):
            shift = round_no % len(contenders)
            done: dict[str, dict[str, Any]] = {}
            for name, tree in contenders[shift:] + contenders[:shift]:
                r = run_contender(
                    name,
                    tree,
                    bootstrap=bootstrap,
                    prefix=prefix,
                    tmp=tmp,
                    total=total,
                    max_offsets=args.max_offsets,
                    broker=broker,
                    exclude=exclude,
                )
                if round_no == 0 and "module" in r:
                    print(f"{name}: driver imported {r['module']}; workers {r['python_paths']}")
                results[name].append(done.setdefault(name, r))
                print(f"round {round_no + 1}: " + _line(r, total), flush=True)
            if "quix" in done:
                rows = quix.check_same(done["inorder"]["output"], done["quix"]["output"])
                print(f"round {round_no + 1}: quix's {rows:,} change rows = inorder's", flush=True)
    loads.append(os.getloadavg())
    print(report(results, total, args, loads))
    return 0


def report(
    results: dict[str, list[dict[str, Any]]],
    total: int,
    args: argparse.Namespace,
    loads: list[tuple[float, float, float]],
) -> str:
    """The Markdown table of medians (and the CPU by role of each contender)."""
    med = common.median

    def m(rs: list[dict[str, Any]], value: Any) -> float:
        return med([value(r) for r in rs])

    def whole(r: dict[str, Any]) -> float:
        return (r["cpu"] + r["broker"]) / total * 1e6

    def steady(r: dict[str, Any]) -> float:
        return float(r["steady_us"])

    limit, limit_steady = m(results["limit"], whole), m(results["limit"], steady)
    limit_rate = m(results["limit"], lambda r: total / r["wall"])
    van = results.get("vanilla") or []
    vanilla = m(van, whole) if van else 0.0
    vanilla_steady = m(van, steady) if van else 0.0
    rows = []
    for name, rs in results.items():
        mine, mine_steady = m(rs, whole), m(rs, steady)
        rate = m(rs, lambda r: total / r["wall"])
        startup = f"{m(rs, lambda r: r['startup']):.1f}"
        if rs[0]["first_commit"] == rs[0]["first_commit"]:
            startup += f" / {m(rs, lambda r: r['first_commit']):.1f}"
        rows.append(
            [
                name,
                f"{mine:.1f}",
                f"{m(rs, lambda r: r['cpu'] / total * 1e6):.1f}",
                f"{m(rs, lambda r: r['broker'] / total * 1e6):.1f}",
                f"{mine_steady:.1f}",
                f"{rate:,.0f}",
                f"{m(rs, lambda r: r['steady_rate']):,.0f}",
                startup,
                f"{limit / mine:.2f} ({limit_steady / mine_steady:.2f})",
                f"{vanilla / mine:.2f} ({vanilla_steady / mine_steady:.2f})" if van else "-",
                f"{rate / limit_rate:.2f}",
                len(rs),
            ]
        )
    text = common.table(
        [
            "contender",
            "us CPU/record, whole run (tree + broker)",
            "tree",
            "broker",
            "steady us CPU/record (tree)",
            "msg/s whole run",
            "steady msg/s",
            "start-up s (first batch / its commit)",
            "limit us / this (steady)",
            "vanilla us / this (steady)",
            "msg/s / limit's",
            "runs",
        ],
        rows,
        right=tuple(range(1, 12)),
    )
    roles = []
    for name, rs in results.items():
        split: dict[str, list[float]] = {}
        for r in rs:
            for role, seconds in r["by_role"].items():
                split.setdefault(role, []).append(seconds / total * 1e6)
        top = sorted(((med(v), k) for k, v in split.items()), reverse=True)[:6]
        roles.append(f"{name}: " + ", ".join(f"{k} {v:.1f}" for v, k in top))
    load = ", ".join(f"{a:.2f} {b:.2f} {c:.2f}" for a, b, c in loads)
    per_run = "\n".join(
        f"{name}: "
        + "; ".join(f"{whole(r):.1f} ({steady(r):.1f} steady, load {r['load']:.1f})" for r in rs)
        for name, rs in results.items()
    )
    return (
        f"{total:,} messages, maxOffsetsPerTrigger {args.max_offsets:,}, {args.rounds} rounds; "
        f"load average (1/5/15 min) before, after: {load}\n\n{text}\n\n"
        "Sampled CPU by process role over the whole run, us/record (medians):\n"
        + "\n".join(roles)
        + "\n\nus CPU/record per run, whole run (tree + broker) and steady (tree):\n"
        + per_run
    )


if __name__ == "__main__":
    sys.exit(main())
