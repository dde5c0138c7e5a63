"""Fault matrix, process faults at the commit's seams: ``kill -9`` exactly between its steps.

A random ``kill -9`` (``test_process_faults.py``) rarely lands inside the few milliseconds
between two commit steps. Here the driver kills itself (``tests/faults/commit_kill.py``) at
each seam of one batch's commit in turn, in one job with both session tables: after staging,
after the change log's manifest, after the change log's commit, and between the current and
the history table's commits. Before each restart the test checks that the kill left the
output in exactly the state the seam names; after the last run the change log must equal the
truth (and ``inorder validate``), the current table must equal the change log rebuilt, and
the history table must answer as-of queries as the change log does, and ``inorder
validate``'s check of the tables must be clean.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable

from inorder.assemble import load_target
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.sessions.rebuild import read_changes, rebuild_tables
from inorder.sessions.tables_check import check_pipeline_tables
from inorder.sessions.tables_delta import BATCH_KEY
from tests.faults.conftest import MatrixRecorder
from tests.faults.test_process_faults import RUN_TIMEOUT, child_env, exact_verdict, finish
from tests.faults.test_storage_outages import broker  # noqa: F401  (a broker of its own)
from tests.fixtures.sessions_job import (
    RESTART_SESSION,
    TWO_LOCAL_CORES,
    sessions_config,
    two_partition_simulation,
)
from tests.integration.test_session_tables import check_history, current_tables, non_empty

#: Each seam and the batch at which the run meeting it dies (one run per seam, in order): each
#: run first finishes the batch the previous kill left, then dies in the next, a fresh one.
SEAMS = [("staged", 1), ("manifest", 2), ("tables", 3), ("between-tables", 4)]


def _kill_at(toml: Path, point: str, batch: int) -> subprocess.CompletedProcess[str]:
    """``inorder run`` that kills itself at ``point`` of batch ``batch``; it must die there."""
    command = [sys.executable, "-m", "tests.faults.commit_kill", point, str(batch), "run"]
    proc = subprocess.Popen(
        [*command, str(toml), "--progress", "quiet"], env=child_env(), cwd=toml.parent,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its JVM and Python workers too
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert done.returncode == -signal.SIGKILL, err[-3000:]
    assert f"commit-kill: {point} batch " in err, err[-3000:]
    return done


def _killed_batch(done: subprocess.CompletedProcess[str]) -> int:
    line = next(x for x in done.stderr.splitlines() if x.startswith("commit-kill: "))
    return int(line.rsplit(" ", 1)[-1])


def _table_batch(path: Path) -> int:
    """The last change-log batch a session table holds (-1: none), from its commit metadata."""
    if not (path / "_delta_log").exists():
        return -1
    batches = [int(e[BATCH_KEY]) for e in DeltaTable(str(path)).history() if BATCH_KEY in e]
    return max(batches, default=-1)


def _change_log(output: Path) -> tuple[set[int], set[int]]:
    """Batch ids with a manifest (committed) and with a done marker (published)."""
    commits = output / "_inorder" / "commits"
    manifests = {int(p.name[:20]) for p in commits.glob("*.json") if p.name[:20].isdigit()}
    done = {int(p.stem) for p in commits.glob("*.done") if p.stem.isdigit()}
    return manifests, done


def _left_as_named(point: str, batch: int, output: Path, current: Path, history: Path) -> str:
    """Assert the output is in the state the seam names; that state in words."""
    manifests, done = _change_log(output)
    held = _table_batch(current), _table_batch(history)
    if point == "staged":
        staged = list((output / "_inorder" / "staging" / str(batch)).rglob("*.staged"))
        assert staged and batch not in manifests, (staged, manifests)
        return f"batch {batch} staged ({len(staged)} files), no manifest"
    if point == "manifest":
        assert batch in manifests and batch not in done, (manifests, done)
        return f"batch {batch}'s manifest written, not published"
    if point == "tables":
        assert batch in done and held[0] < batch and held[1] < batch, (done, held)
        return f"change log through batch {batch}, tables through {held[0]}"
    assert held[0] >= batch > held[1], held
    return f"current table through batch {held[0]}, history through {held[1]}"


def test_kill_9_at_each_seam_of_a_commit(
    broker: str,  # noqa: F811
    tmp_path: Path,
    matrix: MatrixRecorder,
) -> None:
    prefix = f"seam-{random.randrange(10**9)}-"
    simulation = two_partition_simulation(
        prefix, 31, sites=2, faulty=0.2, sessions_per_site=8, rows_per_snapshot=5,
        messages=2000, restart_every=120, end_probability=0.02,
    )  # fmt: skip
    truth = simulate(simulation, broker).ground_truth
    current, history = tmp_path / "current", tmp_path / "history"
    config = sessions_config(
        broker, prefix, tmp_path, name="seams", max_offsets=250, trigger="available-now",
        integrity=RESTART_SESSION, spark=TWO_LOCAL_CORES,
        tables={"current": str(current), "history": str(history)},
    )  # fmt: skip
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    output = tmp_path / "output"

    left: list[tuple[str, str]] = []
    for point, batch in SEAMS:
        killed_at = _killed_batch(_kill_at(toml, point, batch))
        left.append((point, _left_as_named(point, killed_at, output, current, history)))
    final = finish(toml)

    changes = read_changes(str(output))
    ok, check = exact_verdict(changes, truth, toml)
    expected = non_empty(rebuild_tables(changes))
    tables_equal = current_tables(str(current), None) == expected
    as_of = check_history(changes, str(history), None, 30)
    held = _table_batch(current)
    assert held == _table_batch(history) <= max(_change_log(output)[1])
    # A batch that changes no table row (here: only a session's end, kept) commits nothing to
    # the tables, so they may hold an earlier batch than the change log's last; nothing else.
    later = set(
        changes.filter(pc.greater(changes.column("batch_id"), held)).column("op").to_pylist()
    )
    assert later <= {"end"}, (held, later)
    target = load_target(str(toml))
    validated = check_pipeline_tables(target.pipeline, (target.layout.read_info() or {})["id"])
    assert validated is not None
    tables_equal = tables_equal and validated.ok
    check += (
        f"; current table {'equals' if tables_equal else 'DIFFERS from'} the change log "
        f"rebuilt ({len(expected)} sessions); history: {as_of} as-of queries equal; "
        f"validate's tables check {'clean' if validated.ok else 'NOT clean'}"
    )
    for point, state in left:
        matrix.record(
            group="process",
            fault=f"kill -9 of the driver at a commit seam: {point}",
            times=1,
            outcome="continued",
            check=f"left {state}; the next run resumed ({final.records()} records in the "
            f"last); {check}",
            ok=ok and tables_equal,
        )
    assert ok, check
    assert tables_equal, "\n".join([check, *validated.lines()])
