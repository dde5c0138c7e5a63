"""What ``inorder validate`` costs on a session-table pipeline with both session tables.

Run: ``.venv/bin/python bench/validate_scale.py [--records 200000] [--runs 3]
[--partitions 4] [--src DIR ...] [--work DIR] [--write-docs]``

Builds the output once: the simulator publishes ``--records`` session messages (the demo's
shape, no faults) to a local broker, and ``inorder run`` of the ``sessions`` job (change
log as Parquet, current and history tables as Delta) consumes them all. Then
``inorder validate`` runs ``--runs`` times in a fresh process each; with several ``--src``
(source trees, e.g. a ``git worktree`` of an older commit: ``--src old/src --src src``) the
trees alternate within each round, so every contender sees the same load. Per run: wall
seconds, records/s (records validated / wall), CPU seconds of the run and the peak resident
memory of the whole validate process tree (sampled every 50 ms), and its exit status.

``--work DIR`` keeps the built pipeline in ``DIR`` and reuses it on the next run with the
same ``DIR`` (the broker is then started on ``DIR``'s state, and must still hold the topics).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    header,
    median,
    setup_env,
    simulate_backlog,
    table,
    workdir,
    write_section,
)
from bench._process_tree import rss_tree

SECTION = "## inorder validate at scale (session tables)"
PREFIX = "vscale-"
#: The `inorder` command, run by this interpreter (a `--src` tree comes first on its path).
CLI = "import sys; from inorder.cli import main; sys.exit(main())"

PIPELINE = """\
[pipeline]
name = "validate-scale"
checkpoint = "{work}/checkpoint"
trigger = "available-now"
progress = "quiet"

[source]
bootstrap_servers = "{bootstrap}"
topic_pattern = "{prefix}.*"
starting_offsets = "earliest"
max_offsets_per_trigger = {max_offsets}

[processor]
type = "sessions"
options = {{ row_key = "id" }}

[integrity]
tier = "strict"
on_violation = "restart_session"

[sink]
type = "parquet"
path = "{work}/output"
partition_by = ["topic"]
compression = "zstd"

[tables]
current = "{work}/current"
history = "{work}/history"

[spark]
master = "local[2]"
"""


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(src).resolve()), *filter(None, [env.get("PYTHONPATH")])]
        )
    return env


def build(bootstrap: str, work: Path, records: int, max_offsets: int, partitions: int = 4) -> Path:
    """Publish the traffic (4 sites of ``partitions`` each) and run the pipeline over it;
    the pipeline file."""
    spec = work / "pipeline.toml"
    # Written every time: a reused broker listens on a new port.
    spec.write_text(
        PIPELINE.format(work=work, bootstrap=bootstrap, prefix=PREFIX, max_offsets=max_offsets)
    )
    if (work / "built").exists():
        return spec
    started = time.perf_counter()
    simulate_backlog(
        bootstrap, PREFIX, records, sites=4, partitions=partitions, sessions_per_site=50
    )
    print(f"simulated {records:,} messages in {time.perf_counter() - started:.0f} s", flush=True)
    started = time.perf_counter()
    with open(work / "run.log", "ab") as log:
        subprocess.run(
            [sys.executable, "-c", CLI, "run", str(spec)],
            check=True,
            stdout=log,
            stderr=log,
            env=_env(None),
        )
    print(f"pipeline ran in {time.perf_counter() - started:.0f} s", flush=True)
    (work / "built").write_text("")
    return spec


def validate_once(
    spec: Path,
    src: str | None,
    work: Path,
    profile: str | None = None,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    """One ``inorder validate --json`` run: wall, peak tree RSS, records, exit status.

    ``profile``: a py-spy output file (raw collapsed stacks); the run is then sampled by
    py-spy (its own process is left out of the peak memory: it is not validate's)."""
    # The run's recorded settings name the broker it ran against: a reused one has moved.
    bootstrap = f"source.bootstrap_servers={_bootstrap(spec)}"
    argv = [sys.executable, "-c", CLI, "validate", str(spec), "--json", "--set", bootstrap]
    argv += extra or []
    if profile is not None:
        spy = str(Path(sys.executable).parent / "py-spy")
        argv = [spy, "record", "--format", "raw", "-r", "50", "-o", profile, "--", *argv]
    peak = 0
    # CPU seconds of the run (waited-for children): steadier than the wall on a busy machine.
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(work / "validate.err", "ab") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=_env(src))
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))  # type: ignore[union-attr]
        reader.start()
        while proc.poll() is None:
            tree = rss_tree(proc.pid)
            if profile is not None:  # py-spy's own memory is not validate's
                tree -= _rss_self(proc.pid)
            peak = max(peak, tree)
            time.sleep(0.05)
        reader.join()
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    # py-spy writes its own lines to the same standard output.
    text = b"\n".join(x for x in (out[0] or b"{}").splitlines() if not x.startswith(b"py-spy>"))
    doc = json.loads(text.strip() or b"{}")
    records = int(doc.get("totals", {}).get("records", 0))
    return {
        "src": src or "installed",
        "rc": proc.returncode,
        "ok": doc.get("ok"),
        "wall": wall,
        "records": records,
        "rate": records / wall if wall else 0.0,
        "cpu": cpu,
        "peak_mb": peak / 2**20,
        "tables_ok": (doc.get("tables") or {}).get("ok"),
    }


def _bootstrap(spec: Path) -> str:
    import tomllib

    return str(tomllib.loads(spec.read_text())["source"]["bootstrap_servers"])


def _rss_self(pid: int) -> int:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def main() -> None:
    """Build once, validate alternating, print (and optionally record) the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-offsets", type=int, default=200_000)
    parser.add_argument(
        "--partitions", type=int, default=4, help="per site (4 sites); a new --work to change"
    )
    parser.add_argument("--src", action="append", help="a source tree to validate with")
    parser.add_argument("--work", help="keep (and reuse) the built pipeline here")
    parser.add_argument("--profile", help="py-spy raw output file (one run, no --src)")
    parser.add_argument(
        "--validate-arg", action="append", default=[], help="passed on to validate (repeat)"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    setup_env()
    srcs: list[str | None] = list(args.src or [None])
    results: list[dict[str, Any]] = []

    def measure(tmp: str) -> None:
        from bench._common import broker

        work = Path(tmp)
        with broker(tmp) as bootstrap:
            spec = build(bootstrap, work, args.records, args.max_offsets, args.partitions)
            for r in range(args.runs):
                for src in srcs:
                    res = validate_once(spec, src, work, args.profile, args.validate_arg)
                    results.append(res)
                    print(
                        f"round {r} {res['src']}: {res['wall']:.1f} s, {res['records']:,} "
                        f"records, {res['rate']:,.0f} records/s, {res['cpu']:.1f} CPU s, "
                        f"peak {res['peak_mb']:,.0f} MB, "
                        f"exit {res['rc']} ok={res['ok']} tables_ok={res['tables_ok']}, "
                        f"load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )

    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        measure(args.work)
    else:
        with workdir("validate-scale-") as tmp:
            measure(tmp)
    rows = []
    for src in srcs:
        mine = [r for r in results if r["src"] == (src or "installed")]
        rows.append(
            [
                src or "installed",
                f"{mine[0]['records']:,}",
                f"{median([r['wall'] for r in mine]):.1f}",
                f"{median([r['rate'] for r in mine]):,.0f}",
                f"{median([r['cpu'] for r in mine]):.1f}",
                f"{median([r['records'] / r['cpu'] for r in mine if r['cpu']]):,.0f}",
                f"{median([r['peak_mb'] for r in mine]):,.0f}",
                ", ".join(str(r["rc"]) for r in mine),
            ]
        )
    text = table(
        [
            "source",
            "records",
            "wall s",
            "records/s",
            "CPU s",
            "records/CPU s",
            "peak RSS MB",
            "exit",
        ],
        rows,
        (1, 2, 3, 4, 5, 6),
    )
    print(text)
    if args.write_docs:
        command = "python bench/validate_scale.py " + " ".join(sys.argv[1:])
        write_section(SECTION, f"{SECTION}\n\n{header(command)}\n\n{text}\n")
    _ = ROOT


if __name__ == "__main__":
    main()
