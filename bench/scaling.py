"""Throughput vs number of topic-partitions, on local[2] and local-cluster[2,1,1024].

Usage: python bench/scaling.py [--messages 100000] [--max-offsets 50000]
       [--partitions 1,2,4,8] [--masters "local[2],local-cluster[2,1,1024]"] [--write-docs]

For each master and partition count: one topic with that many partitions holding the same
number of session messages, the session-table pipeline in a fresh child process (a JVM holds
one SparkContext), Trigger.AvailableNow. Reported: whole-run and steady (data batches after
the first) messages/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

SECTION = "## Scaling"


def child(master: str, bootstrap: str, prefix: str, work: str, total: int, max_offsets: int) -> int:
    """Run the pipeline once on ``master``; print its rates as JSON."""
    common.setup_env()
    import e2e_throughput

    from inorder.pipeline.spark import build_spark_session

    build_spark_session(master, "scaling", local_dir=work)
    result = e2e_throughput.inorder_run(bootstrap, prefix, work, total, max_offsets, master=master)
    print("RESULT " + json.dumps({"whole": result["whole"], "steady": result["steady"]}))
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        a = sys.argv[2:]
        return child(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--max-offsets", type=int, default=50_000)
    parser.add_argument("--partitions", default="1,2,4,8")
    parser.add_argument("--masters", default="local[2],local-cluster[2,1,1024]")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    common.setup_env()
    command = "python bench/scaling.py " + " ".join(sys.argv[1:])
    rows = []
    with common.workdir("inorder-scaling-") as tmp, common.broker(tmp) as bootstrap:
        for parts in [int(p) for p in args.partitions.split(",")]:
            prefix = f"scale{parts}-{uuid.uuid4().hex[:6]}-"
            sim = common.simulate_backlog(
                bootstrap, prefix, args.messages, sites=1, partitions=parts, sessions_per_site=120
            )
            for master in _split(args.masters):
                work = f"{tmp}/{prefix}{len(rows)}"
                Path(work).mkdir()
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        master,
                        bootstrap,
                        prefix,
                        work,
                        str(sim.records),
                        str(args.max_offsets),
                    ],
                    capture_output=True,
                    text=True,
                )
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(out.stderr[-2000:])
                    raise SystemExit(f"run failed: {master}, {parts} partitions")
                r = json.loads(line[7:])
                rows.append([master, parts, f"{r['whole']:,.0f}", f"{r['steady']:,.0f}"])
                print(rows[-1], flush=True)
    text = (
        f"{SECTION}\n\n{common.header(command)}\n\n"
        f"One topic, {args.messages:,} session messages, `maxOffsetsPerTrigger` "
        f"{args.max_offsets:,}, a fresh process per row.\n\n"
        + common.table(
            ["master", "partitions", "whole run msg/s", "steady msg/s"], rows, right=(1, 2, 3)
        )
        + "\n"
    )
    print(text)
    if args.write_docs:
        common.write_section(SECTION, text)
    return 0


def _split(masters: str) -> list[str]:
    """Split a comma list whose items may contain commas inside brackets."""
    out, depth, cur = [], 0, ""
    for ch in masters:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur] if cur else out


if __name__ == "__main__":
    sys.exit(main())
