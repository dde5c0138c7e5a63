"""Write docs/reliability.md from the fault matrix's recorded rows.

Usage::

    bash scripts/test.sh tests/faults
    .venv/bin/python scripts/reliability_report.py [--rows DIR] [--out FILE]

The rows are those the fault-injection tests (``tests/faults/``) wrote under
``.inorder/fault-matrix/`` (``tests/faults/matrix.py``); the page has a header (what the suite
is, how to run it, when and where it ran), one table per fault group and a summary line.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.faults.matrix import FaultRow, matrix_dir, read_rows  # noqa: E402

#: Groups in the order the page shows them; others follow alphabetically.
GROUP_ORDER = (
    "process",
    "broker",
    "storage",
    "two drivers",
    "bad input",
    "data",
    "security",
)

HEADER = """# Reliability: the fault matrix

What inorder does when things break, measured by the fault-injection suite (`tests/faults/`).
Every case runs the real pieces (the local Kafka-protocol broker, the S3 server, Spark),
injects one fault (a killed driver, worker or executor, a stopped broker, a deleted topic,
expired records, a failing store, a second driver, bad input), and checks what followed:
either the output is exact (checked against the simulator's ground truth and with
`inorder validate`: no missing, extra, different or duplicated row; where the check says so,
also `inorder verify --digests` of the output: its commits tile every partition and every
committed row matches its digest) or the run ends with the
named error the fault calls for, whose exact message the test asserts.

Outcomes: **continued** (the run, or the next one, finished exactly), **named error** (the run
stopped with one line naming what broke and where), **policy action** (the configured policy
handled it, e.g. `fail_on_data_loss = false` skipped lost records), **refused** (nothing
started). *ok* says whether the test found what it expects.

Run it and rebuild this page:

```bash
bash scripts/test.sh tests/faults
.venv/bin/python scripts/reliability_report.py
```
"""


def _machine() -> str:
    cores = os.cpu_count() or 0
    memory = ""
    try:
        import psutil  # type: ignore[import-untyped]

        memory = f", {psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        pass
    system = f"{platform.system()} {platform.machine()}"
    return f"{system}, {cores} cores{memory}, Python {platform.python_version()}"


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


#: A path in a test's temporary directory: the page shows ``<dir>`` (and the file's name) instead,
#: so it names no path of the machine it ran on.
_TEMP_PATH = re.compile(r"(?:/private)?/(?:tmp|var/folders)/[^\s'\",;:)]*[^\s'\",;:).]")


def _scrubbed(found: re.Match[str]) -> str:
    name = found.group(0).rsplit("/", 1)[-1]
    return f"<dir>/{name}" if "." in name else "<dir>"


def _cell(text: str) -> str:
    return _TEMP_PATH.sub(_scrubbed, text).replace("|", "\\|").replace("\n", " ")


def _group_key(group: str) -> tuple[int, str]:
    return (GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER), group)


def render(rows: Sequence[FaultRow], generated: float | None = None) -> str:
    """The page for ``rows``."""
    stamp = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(generated or time.time()))
    recorded = [r.recorded_at for r in rows]
    span = (
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(min(recorded)))} to "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(max(recorded)))}"
        if recorded
        else "no rows"
    )
    lines = [
        HEADER,
        "## This run",
        "",
        f"- generated: {stamp}; rows recorded {span}",
        f"- machine: {_machine()}",
        f"- load average when generated: {_load()}",
        "",
    ]
    groups: dict[str, list[FaultRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    for group in sorted(groups, key=_group_key):
        lines += [
            f"## {group[:1].upper() + group[1:]} faults",
            "",
            "| fault | times | outcome | check | ok |",
            "|---|---|---|---|---|",
        ]
        for row in groups[group]:
            lines.append(
                f"| {_cell(row.fault)} | {row.times} | {row.outcome} | {_cell(row.check)} | "
                f"{'yes' if row.ok else '**no**'} |"
            )
        lines.append("")
    failed = [r for r in rows if not r.ok]
    verdict = (
        "all exact or the named error"
        if not failed
        else f"{len(failed)} not ok: " + "; ".join(f"{r.group}: {r.fault}" for r in failed)
    )
    lines += [
        "## Summary",
        "",
        f"{len(rows)} rows in {len(groups)} groups, {sum(r.times for r in rows)} faults "
        f"injected; {verdict}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=Path, default=None, help="rows folder (default: the suite's)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability.md")
    args = parser.parse_args(argv)
    folder = args.rows or matrix_dir()
    rows = read_rows(folder)
    if not rows:
        print(f"no fault-matrix rows in {folder}: run bash scripts/test.sh tests/faults first")
        return 1
    args.out.write_text(render(rows))
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
