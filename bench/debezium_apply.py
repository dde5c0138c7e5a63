"""CPU per record of the Debezium session apply (one process, no Spark), against another tree.

The session-table processor over Debezium change events, through the engine's ordered apply
(the reference runner): decode, source-position check, apply. ``--vs REF`` runs the same
events through the code of a git revision (checked out into a temporary worktree) in turn
with this tree's, alternating, and prints the median of the rounds for each.

    .venv/bin/python bench/debezium_apply.py --events 50000 --rounds 5 --vs c484513
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_ONE_RUN = """
import json, random, sys, time
from datetime import UTC, datetime
import msgspec
from inorder.engine.reference import ReferenceRunner
from inorder.integrity import Integrity
from inorder.records import KafkaRecord
from inorder.sessions import Debezium, SessionTables

n = int(sys.argv[1]); rng = random.Random(1); when = datetime(2024, 1, 1, tzinfo=UTC)
src = {"db": "postgres", "schema": "inventory", "table": "orders", "snapshot": "false"}
recs = []
for i in range(n):
    rid = rng.randrange(2000) if i > 2000 else i
    src = {**src, "sequence": json.dumps([str(10 * i), str(10 * i + 5)])}
    ev = {"op": "c" if i <= 2000 else "u", "before": None,
          "after": {"id": rid, "name": f"n{i}", "qty": i % 7}, "source": src, "ts_ms": i}
    recs.append(KafkaRecord("t", 0, i, None, msgspec.json.encode(ev), when))
proc = SessionTables(envelope=Debezium())
runner = ReferenceRunner(proc, proc.default_codec(), Integrity.strict())
t0 = time.process_time()
runner.run_batch(recs, 0, when)
assert not runner.result.violations, runner.result.violations[:2]
print((time.process_time() - t0) / n * 1e6)
"""


def one_run(src: Path, events: int) -> float:
    """CPU µs per record of one run with the package at ``src``."""
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(src)!r})\n{_ONE_RUN}",
         str(events)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(done.stdout.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Alternate this tree and ``--vs`` over ``--rounds``; print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vs", help="a git revision to compare with")
    args = parser.parse_args(argv)
    trees = {"this tree": ROOT / "src"}
    with tempfile.TemporaryDirectory() as tmp:
        if args.vs:
            other = Path(tmp) / "other"
            subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), args.vs],
                           cwd=ROOT, check=True)  # fmt: skip
            trees[args.vs] = other / "src"
        try:
            times: dict[str, list[float]] = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, src in trees.items():
                    times[name].append(one_run(src, args.events))
        finally:
            if args.vs:
                subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT)
    for name, values in times.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}: median {statistics.median(values):.2f} µs CPU/record ({rounds})")
    print(json.dumps({n: statistics.median(v) for n, v in times.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
