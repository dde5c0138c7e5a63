"""What the exact-fit check of output rows costs the ordered apply loop (CPU per record).

Run: ``.venv/bin/python bench/row_check.py [--records N] [--runs R] [--write-docs]``

One process, no Spark: ``OrderedApplier`` applies the same JSON records (1,000 keys) with a
processor yielding one 5-field row per record, with the check (what runs) and with it
replaced by a no-op, alternating, ``--runs`` times each. CPU seconds per record
(``time.process_time``) are reported: the check runs inside the engine's Python worker,
so this is what it adds to every record's cost there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import header, table, write_section
from tests.property.procs import MsgCodec, Tallier

import inorder.engine.apply as apply_module
from inorder.engine.reference import DictStateView
from inorder.integrity import Integrity
from inorder.state.entry import PartitionMeta


def records(n: int) -> list[tuple[int, bytes, bytes, int, Any]]:
    """Kafka-shaped records of the test processor's messages."""
    return [
        (i, b"k", json.dumps({"k": f"k{i % 1000}", "v": i % 7}).encode(), i * 1000, ())
        for i in range(n)
    ]


def cpu_us_per_record(recs: list[Any], check: bool) -> float:
    """Apply ``recs`` once; CPU microseconds per record."""
    original = apply_module._row_checker
    if not check:
        apply_module._row_checker = lambda processor: apply_module._no_problem
    try:
        applier = apply_module.OrderedApplier(
            Tallier(),
            MsgCodec(),
            Integrity.strict(),
            DictStateView({}),
            "t",
            0,
            0,
            0,
            PartitionMeta(),
            copy_state=lambda s: s,
        )
        started = time.process_time()
        applier.apply(recs)
        return (time.process_time() - started) / len(recs) * 1e6
    finally:
        apply_module._row_checker = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    recs = records(args.records)
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.runs):
        for check in (False, True):
            runs[check].append(cpu_us_per_record(recs, check))
    without, with_check = statistics.median(runs[False]), statistics.median(runs[True])
    rows = [
        ["apply loop, no row check", f"{without:.2f}", " ".join(f"{x:.2f}" for x in runs[False])],
        [
            "apply loop, exact-fit row check",
            f"{with_check:.2f}",
            " ".join(f"{x:.2f}" for x in runs[True]),
        ],
        ["the check's cost", f"{with_check - without:+.2f}", ""],
    ]
    text = table(["contender", "CPU us/record (median)", "runs"], rows, right=[1])
    print(text)
    if args.write_docs:
        command = f"bench/row_check.py --records {args.records} --runs {args.runs}"
        write_section(
            "## Output row check",
            f"## Output row check\n\n{header(command)}\n\n{text}\n\nRows are checked per "
            "`process` call by a function generated for the row type (exact type tests per "
            "field): a generic loop over field descriptors cost about 0.8 us/record here.",
        )


if __name__ == "__main__":
    main()
