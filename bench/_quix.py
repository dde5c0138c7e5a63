"""The Quix Streams contender of ``bench/cpu_per_record.py``: its virtualenv, its run, its check.

quixstreams 3.28 needs confluent-kafka < 2.13 and the project's virtualenv has a newer one,
so Quix runs from its own virtualenv, ``.venv-bench-quix`` beside the project's, built on
first use with the project's interpreter: quixstreams, and msgspec, pyarrow and obstore at the
project's versions (decoding and Parquet writing the same as inorder's; obstore because
``inorder.sessions`` imports ``inorder.sinks``, whose storage layer imports it). inorder itself
is not installed there: the run puts the tree's ``src`` on ``PYTHONPATH``, as for the other
contenders. ``bench/quix_sessions.py`` is the program it runs.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Imported from the bench directory or as ``bench._quix`` (the unit tests): the shared
# session-job pieces live beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _session_rows import CHANGE_COLUMNS

QUIXSTREAMS = "3.28.1"
#: Packages whose versions must match the project's virtualenv (see the module docstring).
SAME_AS_PROJECT = ("msgspec", "pyarrow", "obstore")
PROGRAM = Path(__file__).resolve().parent / "quix_sessions.py"
#: The columns both outputs are compared on (inorder adds ``batch_id``).
COLUMNS = CHANGE_COLUMNS
#: The sort order of the comparison: every column but ``kafka_ts``.
ORDER = ("topic", "partition", "offset", "session", "seq", "op", "row_id", "row")


def venv_python(root: Path) -> Path:
    """The interpreter of the Quix virtualenv of the project at ``root``."""
    return root / ".venv-bench-quix" / "bin" / "python"


def _pins() -> list[str]:
    pins = [f"quixstreams=={QUIXSTREAMS}", "numpy"]
    return pins + [f"{p}=={importlib.metadata.version(p)}" for p in SAME_AS_PROJECT]


def ensure_venv(root: Path) -> Path:
    """The Quix virtualenv's interpreter, the virtualenv built or brought up to date first."""
    python = venv_python(root)
    pins = _pins()
    probe = (
        "import importlib.metadata as m, sys\n"
        "print(' '.join(f'{p}=={m.version(p)}' for p in sys.argv[1:]))\n"
    )
    if python.exists():
        names = [p.split("==")[0] for p in pins if "==" in p]
        found = subprocess.run(
            [str(python), "-c", probe, *names], capture_output=True, text=True, check=False
        )
        if found.returncode == 0 and set(found.stdout.split()) == {p for p in pins if "==" in p}:
            return python
    venv = python.parent.parent
    print(f"building {venv} ({', '.join(pins)})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Keeps git from listing the virtualenv (as Python 3.13's venv does by itself).
    (venv / ".gitignore").write_text("*\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins],
        check=True,
    )
    # inorder's session processor must import there without PySpark (from PYTHONPATH).
    check = "import inorder.sessions.processor, inorder.sessions.messages, sys\n" + (
        "assert 'pyspark' not in sys.modules, 'inorder.sessions imported pyspark'"
    )
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    subprocess.run([str(python), "-c", check], env=env, check=True)
    return python


def argv(
    python: Path, bootstrap: str, prefix: str, work: str, total: int, commit_every: int
) -> list[str]:
    """The command line of one Quix run writing to ``{work}/output``."""
    return [
        str(python),
        str(PROGRAM),
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        "--out",
        f"{work}/output",
        "--state-dir",
        f"{work}/state",
        "--total",
        str(total),
        "--commit-every",
        str(commit_every),
    ]


def summary(events: list[dict[str, Any]], start_epoch: float, total: int) -> dict[str, Any]:
    """Start-up, first commit and the commits (seconds since ``start_epoch``, messages).

    Raises SystemExit unless the run printed its line and applied all ``total`` messages.
    """
    info = next((e for e in events if e.get("event") == "quix"), None)
    if info is None:
        raise SystemExit("quix: the run printed no result line")
    if info["records"] != total:
        raise SystemExit(f"quix read {info['records']} records, expected {total}")
    commits = [(at - start_epoch, int(n)) for at, n in info["commits"] if n]
    return {
        "startup": info["first_message"] - start_epoch,
        "first_commit": commits[0][0] if commits else float("nan"),
        "batches": len(commits),
        "commits": commits,
        "rows": int(info["rows"]),
    }


def _normalized(table: Any) -> Any:
    """``table``'s :data:`COLUMNS` with one type each, sorted by :data:`ORDER`."""
    import pyarrow as pa

    types = {
        "partition": pa.int32(),
        "offset": pa.int64(),
        "seq": pa.int64(),
        # The same instant compares equal whatever the unit or time zone it was stored in.
        "kafka_ts": pa.timestamp("us", tz="UTC"),
    }
    cols = [table.column(c).cast(types.get(c, pa.string())) for c in COLUMNS]
    flat = pa.table(cols, names=list(COLUMNS))
    return flat.sort_by([(c, "ascending") for c in ORDER])


def first_difference(expected: Any, actual: Any, chunk: int = 50_000) -> str | None:
    """The first difference between two sets of change rows (pyarrow tables), else None.

    Rows are compared sorted by :data:`ORDER` on :data:`COLUMNS` (other columns ignored).
    """
    a, b = _normalized(expected), _normalized(actual)
    if a.num_rows == b.num_rows and a.equals(b):
        return None
    for start in range(0, max(a.num_rows, b.num_rows), chunk):
        left = a.slice(start, chunk).to_pylist()
        right = b.slice(start, chunk).to_pylist()
        for i, (x, y) in enumerate(zip(left, right, strict=False)):
            if x != y:
                return f"sorted row {start + i}: expected {x}, got {y}"
        if len(left) != len(right):
            break
    n = min(a.num_rows, b.num_rows)
    extra = (a if a.num_rows > n else b).slice(n, 1).to_pylist()
    return (
        f"{a.num_rows} rows expected, {b.num_rows} got; the first {n} agree, then "
        f"{'missing' if a.num_rows > n else 'extra'} {extra[0] if extra else '?'}"
    )


def check_same(inorder_output: str, quix_output: str) -> int:
    """Rows compared; raises SystemExit naming the first difference if the outputs differ."""
    import pyarrow.dataset as ds

    from inorder.sinks.parquet_read import read_committed

    expected = read_committed(inorder_output)
    actual = ds.dataset(quix_output, format="parquet").to_table()
    diff = first_difference(expected, actual)
    if diff is not None:
        raise SystemExit(
            f"quix's change rows ({quix_output}) differ from inorder's ({inorder_output}): {diff}"
        )
    return int(expected.num_rows)
