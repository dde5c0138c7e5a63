"""Cost per record against the number of topic-partitions: the same job over 12 to 4,800.

Run: ``.venv/bin/python bench/partitions.py [--partitions 12,120,1200] [--messages 400000]
[--max-offsets 100000] [--rounds 3] [--vs CHECKOUT] [--with-set SECTION.KEY=VALUE] [--quick]
[--with-limit] [--with-quix] [--quix-limit 900]``

``--quick`` (~5 minutes on 2 shared cores for 12/120/1,200): 200,000 messages, batches of
50,000, one round. ``--partitions 12,120,1200,4800`` adds the 4,800 case (slow before the
per-partition costs were removed).

For each count N, one backlog of simulated session traffic is produced to the local broker
(N/4 sites of one topic each, 4 partitions per topic, ``--sessions-per-site`` sessions per
site, no faults: the ``examples/sessions.toml`` shape), the same number of messages for
every N. Then ``inorder run examples/sessions.toml`` reads all of it on ``local[2]`` with
Trigger.AvailableNow, ``maxOffsetsPerTrigger`` = ``--max-offsets``, Parquet zstd partitioned
by topic, in a fresh process tree (``bench/cpu_per_record.py``'s measure: user + system
seconds of every process, reaped as a subreaper). With ``--vs CHECKOUT`` the same run from
another source tree alternates with this one (the order rotates every round), so before and
after are measured side by side under the same load.

Reported per N and contender (medians over rounds): steady CPU per record (from the first
batch's commit to the last's, whole tree; the broker, not part of the tree, shown apart over
the whole run), steady seconds per batch (the batches after the
first), the tasks' own phases summed over partitions per batch (``load``: opening state,
``state``: the state delta, ``write``: output, ``read``: Kafka, ``apply``) and the driver's
``commit``, each also as milliseconds per topic-partition per batch, plus the output files
a steady batch committed, and output files and checkpoint bytes at the end. Each run's line
also gives its CPU seconds by process (driver, JVM, Python workers, planners) and the
broker's.

With ``--with-limit`` and ``--with-quix`` the same backlogs go to ``bench/cpu_per_record.py``'s
other contenders too, alternating with inorder: the one-process limit (a confluent-kafka
consumer over every partition doing the whole job; its steady CPU per record is its read
loop's) and Quix Streams (exactly-once, a checkpoint every ``--max-offsets`` messages; its
change rows are checked equal to inorder's after each round). A Quix run that stops short of
the backlog (no message for 60 s, or still running after ``--quix-limit``, 15 minutes: it
stalled) is reported as such, not retried. Neither has inorder's phases, files or
checkpoint: "-" in those columns.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common
import _process_tree as process_tree
import _quix as quix
from cpu_per_record import DRIVER, _events, _steady, run_contender

ROOT = common.ROOT

#: Phases of the batch report shown per batch and per topic-partition.
PHASES = ("tasks", "commit", "load", "state", "write", "read", "apply")


def _tree_bytes(path: str) -> tuple[int, int]:
    """Files and bytes under ``path``."""
    files = size = 0
    for base, _, names in os.walk(path):
        for name in names:
            files += 1
            size += os.path.getsize(os.path.join(base, name))
    return files, size


def run_once(
    kind: str,
    tree: Path,
    *,
    bootstrap: str,
    prefix: str,
    tmp: str,
    total: int,
    max_offsets: int,
    exclude: list[int],
    sets: tuple[str, ...] = (),
    broker: int | None = None,
) -> dict[str, Any]:
    """One ``inorder run`` over the topics ``prefix*`` (with ``--set`` of each of ``sets``);
    what it cost."""
    work = f"{tmp}/{uuid.uuid4().hex[:8]}"
    Path(work).mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), TMPDIR=work)
    argv = [sys.executable, "-c", DRIVER]
    argv += common.sessions_run_args(bootstrap, prefix, max_offsets, work)
    # Fixed batches: sized by duration, a slower contender would run more, smaller batches.
    argv += ["--set", "source.target_batch_duration=off"]
    for setting in sets:
        argv += ["--set", setting]
    # The broker (this process's child) is not part of the run's tree: it is left running,
    # and its CPU over the run is shown beside the tree's.
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
    module = next((e["file"] for _, e in events if e.get("event") == "bench_module"), "")
    if not Path(module).resolve().is_relative_to((tree / "src").resolve()):
        raise SystemExit(f"{kind}: the driver imported {module}, not {tree / 'src'}")
    batches = [(at, e) for at, e in events if e.get("event") == "batch" and e["records"] > 0]
    records = sum(int(e["records"]) for _, e in batches)
    if records != total:
        raise SystemExit(f"{kind} read {records} records, expected {total}")
    result: dict[str, Any] = {
        "kind": kind,
        "wall": run.wall,
        "cpu": run.cpu,
        "load_avg": os.getloadavg()[0],
        "broker": broker_cpu,
        "by_role": run.by_role,
        "steady_us": float("nan"),
        "steady_rate": float("nan"),
    }
    _steady(result, run.series, [(at, int(e["records"])) for at, e in batches])
    steady = [e for _, e in batches[1:]] or [e for _, e in batches]
    result["batch_s"] = common.median([float(e["duration_seconds"]) for e in steady])
    # Per batch: its seconds and the tasks' state commit (snapshots land in some batches).
    result["series"] = [
        (int(e["batch_id"]), float(e["duration_seconds"]), e.get("seconds", {}).get("state", 0.0))
        for _, e in batches
    ]
    for phase in PHASES:
        result[phase] = common.median([float(e.get("seconds", {}).get(phase, 0.0)) for e in steady])
    opens: dict[str, int] = {}
    for e in steady:
        for k, v in (e.get("state_opens") or {}).items():
            opens[k] = opens.get(k, 0) + int(v)
    result["opens"] = {k: v // len(steady) for k, v in opens.items()}
    result["batch_files"] = common.median([float(e.get("output_files", 0)) for e in steady])
    result["files"] = _tree_bytes(f"{work}/output")[0]
    result["checkpoint"] = _tree_bytes(f"{work}/checkpoint")[1]
    result["checkpoint_parts"] = _parts(f"{work}/checkpoint")
    # The workers' RocksDB caches (TMPDIR is the run's directory: the default cache_dir).
    result["cache"] = _tree_bytes(f"{work}/inorder-state-cache")[1]
    result["output"] = f"{work}/output"
    return result


#: A Quix run still going after this many seconds is stopped and reported as stalled (it
#: stops by itself only after 60 s without any message; a trickle would go on for hours).
#: ``--quix-limit`` sets it.
QUIX_LIMIT_S = 900.0


def _stop_quix(after: float) -> None:
    """SIGKILL this process's descendants that run the Quix program (after ``after`` s)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("quix_sessions.py" in part for part in child.cmdline()):
                print(f"quix: still running after {after:.0f} s: stopped", flush=True)
                child.kill()


def run_other(kind: str, quix_limit: float = QUIX_LIMIT_S, **kwargs: Any) -> dict[str, Any]:
    """One run of the limit or Quix (``bench/cpu_per_record.py``'s contenders) over the same
    backlog, in the shape of :func:`run_once`'s results ("-" for what only inorder has)."""
    watchdog = None
    if kind == "quix":
        watchdog = threading.Timer(quix_limit, _stop_quix, args=(quix_limit,))
        watchdog.daemon = True
        watchdog.start()
    try:
        r = run_contender(kind, ROOT, **kwargs)
    except SystemExit as exc:
        if kind != "quix":
            raise
        # Quix stops after 60 s without a message: short of the backlog, it stalled.
        print(f"quix: {exc}", flush=True)
        r = {"kind": kind, "wall": float("nan"), "cpu": float("nan"), "output": ""}
        r["steady_us"] = r["steady_rate"] = float("nan")
        r["stalled"] = str(exc).splitlines()[0]
    finally:
        if watchdog is not None:
            watchdog.cancel()
    r.update({phase: float("nan") for phase in PHASES})
    r.update(batch_s=float("nan"), opens={}, batch_files=float("nan"), series=[])
    r.update(files=-1, checkpoint=float("nan"), checkpoint_parts={}, cache=0)
    r["load_avg"] = os.getloadavg()[0]
    return r


def _parts(checkpoint: str) -> dict[str, tuple[int, int]]:
    """Files and bytes per top-level entry of the checkpoint (``state/``, ``spark/``, ...)."""
    parts: dict[str, tuple[int, int]] = {}
    for entry in sorted(Path(checkpoint).rglob("*")):
        if entry.is_file():
            rel = entry.relative_to(checkpoint).parts
            # One level deeper under the engine's directory: state, batches, history, ...
            name = "/".join(rel[:2]) if rel[0] == "engine" and len(rel) > 2 else rel[0]
            files, size = parts.get(name, (0, 0))
            parts[name] = (files + 1, size + entry.stat().st_size)
    return parts


def _run_retrying(kind: str, tree: Path, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_once`, once more when the run's start-up check found no broker (on a
    loaded machine the broker sometimes answers its metadata request after the 10 s wait)."""
    try:
        return run_once(kind, tree, **kwargs)
    except SystemExit as exc:
        if "no broker answered" not in str(exc):
            raise
        print(f"{kind}: no broker answered at start-up; once more", flush=True)
        return run_once(kind, tree, **kwargs)


def _line(n: int, r: dict[str, Any]) -> str:
    phases = ", ".join(f"{p} {r[p]:.2f}" for p in PHASES)
    return (
        f"{n:>5} tp {r['kind']:<16} steady {r['steady_us']:6.1f} us/rec "
        f"{r['steady_rate']:>8,.0f} rec/s  {r['batch_s']:.2f} s/batch  wall {r['wall']:.1f} s "
        f"cpu {r['cpu']:.1f} s  [{phases}] opens {r['opens']}  files {r['batch_files']:.0f} per "
        f"batch, {r['files']} in all  "
        f"checkpoint {r['checkpoint'] / 1e6:.1f} MB  load average {r['load_avg']:.1f}  cache "
        f"{r['cache'] / 1e6:.1f} MB; checkpoint parts (files, MB): "
        + ", ".join(f"{k} {f} {b / 1e6:.2f}" for k, (f, b) in r["checkpoint_parts"].items())
        + "; CPU s by process (whole run): "
        + _roles(r)
        + "; slow batches (id: s, state s): "
        + ", ".join(f"{b}: {d:.2f}, {st:.2f}" for b, d, st in r["series"] if d > 1.5 * r["batch_s"])
    )


def _shown(value: float, fmt: str) -> str:
    """``value`` formatted, or "-" where a contender has no such figure (NaN)."""
    return "-" if value != value else format(value, fmt)


def _roles(r: dict[str, Any]) -> str:
    """The run's CPU seconds by process role, largest first, and the broker's."""
    roles = sorted(r.get("by_role", {}).items(), key=lambda kv: -kv[1])
    shown = [f"{k} {v:.1f}" for k, v in roles[:6]]
    return ", ".join([*shown, f"broker {r.get('broker', float('nan')):.1f}"])


def _other_line(r: dict[str, Any]) -> str:
    if "stalled" in r:
        return f"stalled ({r['stalled']})"
    return (
        f"steady {r['steady_us']:6.1f} us/rec {r['steady_rate']:>8,.0f} rec/s  wall "
        f"{r['wall']:.1f} s  cpu {r['cpu']:.1f} s  load average {r['load_avg']:.1f}; CPU s by "
        f"process: {_roles(r)}"
    )


def report(results: dict[tuple[int, str], list[dict[str, Any]]], max_offsets: int) -> str:
    """Markdown table of the medians."""
    med = common.median
    rows = []
    base = {
        kind: med([r["steady_us"] for r in rs if "stalled" not in r])
        for (n, kind), rs in results.items()
        if n == 12
    }
    for (n, kind), rs in sorted(results.items()):
        ran = [r for r in rs if "stalled" not in r]
        if not ran:
            rows.append([n, kind, "stalled: " + rs[0]["stalled"], *["-"] * 10, len(rs)])
            continue
        us = med([r["steady_us"] for r in ran])
        batch_s = med([r["batch_s"] for r in ran])
        per_tp = med([r["batch_s"] / n * 1e3 for r in ran])
        phases = " / ".join(_shown(med([r[p] for r in ran]) / n * 1e3, ".2f") for p in PHASES)
        files = med([float(r["files"]) for r in ran])
        rows.append(
            [
                n,
                kind + (f" ({len(rs) - len(ran)} stalled)" if len(ran) < len(rs) else ""),
                f"{us:.1f}",
                f"{us / base[kind]:.2f}" if base.get(kind) else "-",
                _shown(med([r["broker"] / r["total"] * 1e6 for r in ran]), ".1f"),
                f"{med([r['steady_rate'] for r in ran]):,.0f}",
                _shown(batch_s, ".2f"),
                _shown(per_tp, ".2f"),
                phases if ran[0]["kind"].startswith("inorder") else "-",
                f"{med([r['wall'] for r in ran]):.1f}",
                _shown(med([float(r["batch_files"]) for r in ran]), ".0f"),
                "-" if files < 0 else int(files),
                _shown(med([r["checkpoint"] for r in ran]) / 1e6, ".1f"),
                len(rs),
            ]
        )
    return common.table(
        [
            "topic-partitions",
            "contender",
            "steady us CPU/record",
            "x at 12",
            "broker us CPU/record (whole run)",
            "steady rec/s",
            f"s per {max_offsets:,} batch",
            "ms per tp per batch",
            "ms per tp per batch: " + " / ".join(PHASES),
            "wall s",
            "output files per batch",
            "output files",
            "checkpoint MB",
            "runs",
        ],
        rows,
        right=(0, *range(2, 14)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="12,120,1200", help="comma-separated, x 4")
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--max-offsets", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=None, help="3 (1 with --quick)")
    parser.add_argument("--sessions-per-site", type=int, default=40)
    parser.add_argument(
        "--quick", action="store_true", help="200k messages, batches of 50k, 1 round"
    )
    parser.add_argument(
        "--vs", metavar="CHECKOUT", action="append", default=[], help="also run this tree"
    )
    parser.add_argument(
        "--only-vs", action="store_true", help="run the --vs trees only, not this one"
    )
    parser.add_argument(
        "--with-set",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="also run this tree with this setting (e.g. pipeline.state_deltas=task)",
    )
    parser.add_argument("--with-limit", action="store_true", help="also run the one-process limit")
    parser.add_argument(
        "--with-quix", action="store_true", help="also run Quix Streams (its own virtualenv)"
    )
    parser.add_argument(
        "--quix-limit",
        type=float,
        default=QUIX_LIMIT_S,
        help="seconds after which a Quix run is stopped as stalled",
    )
    args = parser.parse_args()
    if args.quick:
        args.messages, args.max_offsets = 200_000, 50_000
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    counts = [int(x) for x in args.partitions.split(",")]
    if any(n % 4 for n in counts):
        parser.error("--partitions: multiples of 4 (sites x 4 partitions)")
    contenders: list[tuple[str, Path, tuple[str, ...]]] = []
    if not args.only_vs:
        contenders.append(("inorder", ROOT, ()))
    for setting in args.with_set:
        contenders.append((f"inorder ({setting.split('.')[-1]})", ROOT, (setting,)))
    for checkout in args.vs:
        other = Path(checkout).resolve()
        if not (other / "src" / "inorder").is_dir():
            parser.error(f"--vs: {other}/src/inorder is not a directory")
        contenders.append((f"inorder ({other.name})", other, ()))
    if args.with_limit:
        contenders.append(("limit", ROOT, ()))
    if args.with_quix:
        quix.ensure_venv(ROOT)
        contenders.append(("quix", ROOT, ()))
    common.setup_env()
    if not process_tree.set_child_subreaper():
        print("warning: no subreaper; CPU is the sampled lower bound", flush=True)
    loads = [os.getloadavg()]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with common.workdir("inorder-partitions-") as tmp, common.broker(tmp) as bootstrap:
        broker = process_tree.broker_pid(tmp, bootstrap)
        exclude = [os.getpgid(broker)] if broker else []
        prefixes: dict[int, tuple[str, int]] = {}
        for n in counts:
            prefix = f"tp{n}-{uuid.uuid4().hex[:6]}-"
            started = time.perf_counter()
            sim = common.simulate_backlog(
                bootstrap,
                prefix,
                args.messages,
                sites=n // 4,
                sessions_per_site=args.sessions_per_site,
            )
            prefixes[n] = (prefix, int(sim.records))
            print(
                f"{n} topic-partitions: produced {sim.records:,} messages in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
        for round_no in range(args.rounds):
            shift = round_no % len(contenders)
            for n in counts:
                prefix, total = prefixes[n]
                done: dict[str, dict[str, Any]] = {}
                common_args: dict[str, Any] = {
                    "bootstrap": bootstrap,
                    "prefix": prefix,
                    "tmp": tmp,
                    "total": total,
                    "max_offsets": args.max_offsets,
                    "exclude": exclude,
                    "broker": broker,
                }
                for kind, tree, sets in contenders[shift:] + contenders[:shift]:
                    if kind in ("limit", "quix"):
                        r = run_other(kind, args.quix_limit, **common_args)
                        line = f"{n:>5} tp {kind}: " + _other_line(r)
                    else:
                        r = _run_retrying(kind, tree, sets=sets, **common_args)
                        line = _line(n, r)
                    r["total"] = total
                    done[kind] = r
                    results.setdefault((n, kind), []).append(r)
                    print(f"round {round_no + 1}: {line}", flush=True)
                if done.get("quix", {}).get("output") and "inorder" in done:
                    rows = quix.check_same(done["inorder"]["output"], done["quix"]["output"])
                    print(f"round {round_no + 1}: {n} tp: quix's {rows:,} change rows = inorder's")
    loads.append(os.getloadavg())
    load = ", ".join(f"{a:.2f} {b:.2f} {c:.2f}" for a, b, c in loads)
    print(
        f"\n{args.messages:,} messages, maxOffsetsPerTrigger {args.max_offsets:,}, "
        f"{args.rounds} rounds; load average (1/5/15 min) before, after: {load}\n"
    )
    print(report(results, args.max_offsets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
