"""The fault matrix's rows: what each fault-injection test injected and what it found.

Every test in ``tests/faults/`` records one row per fault through the ``matrix`` fixture
(``tests/faults/conftest.py``). Rows are written as JSON files under
``$INORDER_FAULT_MATRIX_DIR`` (default ``.inorder/fault-matrix`` in the checkout), one file per
test, so a run of any subset leaves its rows; ``scripts/reliability_report.py`` turns the rows
of the last run into ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What the job did about the fault.
OUTCOMES = ("continued", "named error", "policy action", "refused")


@dataclass
class FaultRow:
    """One row of the matrix."""

    #: The fault class, e.g. "process", "broker", "storage", "two drivers", "bad input".
    group: str
    #: What was injected, in a few words ("kill -9 of a Python worker mid-task").
    fault: str
    #: How many times it was injected in this test.
    times: int
    #: One of :data:`OUTCOMES`.
    outcome: str
    #: The result check, in a few words ("exact: 0 missing, 0 extra, 0 duplicated; validate
    #: clean"), or the exact message the user saw for a named error.
    check: str
    #: Whether the result is exact or the error is the named one the test expects.
    ok: bool
    #: The pytest node id that produced the row.
    test: str = ""
    seconds: float = 0.0
    recorded_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {OUTCOMES}")


def matrix_dir() -> Path:
    """Where rows are written."""
    return Path(os.environ.get("INORDER_FAULT_MATRIX_DIR", ROOT / ".inorder" / "fault-matrix"))


def write_rows(test: str, rows: list[FaultRow]) -> Path:
    """Write one test's rows (replacing that test's rows of an earlier run)."""
    folder = matrix_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test).strip("_")[:180] + ".json"
    path = folder / name
    path.write_text(json.dumps([asdict(r) for r in rows], indent=1, sort_keys=True))
    return path


def read_rows(folder: Path | None = None) -> list[FaultRow]:
    """Every recorded row, grouped as recorded."""
    out: list[FaultRow] = []
    for path in sorted((folder or matrix_dir()).glob("*.json")):
        out.extend(FaultRow(**doc) for doc in json.loads(path.read_text()))
    return out
