"""Summarise a test run's times (the JUnit XML scripts/test.sh writes) as Markdown.

Usage::

    bash scripts/test.sh                      # writes .inorder/test-times.xml
    .venv/bin/python scripts/test_times.py    # prints the tables for tests/README.md

Pytest's JUnit time of a test includes its share of fixture set-up (a broker, a JVM, a
produced backlog) where that set-up ran: the first test that needs a session fixture pays
for it, so such fixed costs show up as one slow test at the start of each module.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

#: Longest a test outside the soak tests (marked ``slow``) may take, and all soak tests
#: together (tests/README.md).
MAX_TEST_SECONDS = 60
MAX_SOAK_SECONDS = 300


def load(path: Path) -> list[tuple[str, float, str]]:
    """``(test id, seconds, outcome)`` of every test case in the report; the outcome of a soak
    test (tagged by tests/conftest.py) ends in ``, soak``."""
    root = ET.parse(path).getroot()
    out = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        soak = False
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
            elif child.tag == "properties":
                soak = any(p.get("value") == "slow" for p in child.iter("property"))
        out.append((name, float(case.get("time", 0.0)), outcome + (", soak" if soak else "")))
    return out


def render(cases: list[tuple[str, float, str]], top: int) -> str:
    """Markdown: totals per folder, per module, and the slowest tests."""
    by_folder: dict[str, float] = defaultdict(float)
    by_module: dict[str, list[float]] = defaultdict(list)
    for name, seconds, _ in cases:
        module = name.split("::")[0]
        parts = module.split(".")
        by_folder[".".join(parts[:2])] += seconds
        by_module[module].append(seconds)
    total = sum(s for _, s, _ in cases)
    lines = [f"{len(cases)} tests, {total / 60:.1f} minutes in tests", "", "| folder | minutes |"]
    lines.append("|---|---:|")
    for folder, seconds in sorted(by_folder.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {folder} | {seconds / 60:.1f} |")
    lines += ["", "| module | tests | seconds | slowest test s |", "|---|---:|---:|---:|"]
    for module, times in sorted(by_module.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"| {module} | {len(times)} | {sum(times):.0f} | {max(times):.0f} |")
    soak = [s for _, s, outcome in cases if outcome.endswith(", soak")]
    long = [n for n, s, outcome in cases if s > MAX_TEST_SECONDS and not outcome.endswith("soak")]
    lines += [
        "",
        f"Soak tests (marked slow): {len(soak)}, {sum(soak):.0f} s together (target "
        f"<= {MAX_SOAK_SECONDS}); other tests over {MAX_TEST_SECONDS} s: {len(long)}"
        + (f" ({', '.join(f'`{n}`' for n in long)})" if long else ""),
    ]
    lines += ["", "| slowest tests | seconds | outcome |", "|---|---:|---|"]
    for name, seconds, outcome in sorted(cases, key=lambda c: -c[1])[:top]:
        lines.append(f"| `{name}` | {seconds:.0f} | {outcome} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the tables for the report given (default: the last run's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default=".inorder/test-times.xml", type=Path)
    parser.add_argument("--top", type=int, default=25, help="rows of the module and test tables")
    args = parser.parse_args(argv)
    if not args.report.exists():
        print(f"no report at {args.report}: run bash scripts/test.sh first", file=sys.stderr)
        return 2
    print(render(load(args.report), args.top), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
