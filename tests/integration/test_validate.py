"""``inorder validate``: a correct run validates clean; tampered rows are reported exactly."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.fixtures.sessions_job import TWO_LOCAL_CORES, sessions_config, small_simulation

from inorder.assemble import build_pipeline, load_target
from inorder.commands.run import dump_toml
from inorder.dev.simulator import SimulationResult, simulate
from inorder.ops.validate import validate
from inorder.sinks.parquet import committed_files


@dataclass
class RunFixture:
    """A simulated topic set, a finished pipeline run and its TOML file."""

    toml: Path
    config: dict[str, Any]
    work: Path
    sim: SimulationResult
    prefix: str

    @property
    def output(self) -> Path:
        return self.work / "output"


def session_config(
    bootstrap: str,
    prefix: str,
    work: Path,
    *,
    max_offsets: int = 700,
    on_violation: str = "restart_session",
) -> dict[str, Any]:
    """A small session-table pipeline over one simulation's topics (several batches)."""
    return sessions_config(
        bootstrap,
        prefix,
        work,
        name="ops",
        max_offsets=max_offsets,
        integrity={"on_violation": on_violation},
        spark=TWO_LOCAL_CORES,
    )


def make_run(kafka: Any, work: Path, seed: int, faulty: float = 0.0) -> RunFixture:
    """Simulate, run the pipeline to the end, write its TOML file."""
    prefix = f"ops{seed}-{random.randrange(10**9)}-"
    sim = simulate(small_simulation(prefix, seed, faulty), kafka.bootstrap_servers)
    config = session_config(kafka.bootstrap_servers, prefix, work)
    build_pipeline(config).run()
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(config))
    return RunFixture(toml, config, work, sim, prefix)


def cli(
    *args: str, stdin: str | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run ``inorder ARGS`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def finished_run(kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> RunFixture:
    return make_run(kafka, tmp_path_factory.mktemp("validate"), seed=41, faulty=0.3)


def test_correct_run_validates_clean(finished_run: RunFixture) -> None:
    report = validate(load_target(str(finished_run.toml)))
    assert report.partitions, "no partition validated"
    assert report.ok, "\n".join(report.lines())
    assert sum(p.records for p in report.partitions) == finished_run.sim.records
    assert sum(p.expected_rows for p in report.partitions) > 0
    assert all(p.exact_batches for p in report.partitions)

    # The simulated faults made the policy reset sessions: the output matches its
    # recomputation, and the records set aside are reported as their own class (exit 3).
    set_aside = sum(sum(p.set_aside.values()) for p in report.partitions)
    assert set_aside > 0 and report.set_aside == set_aside
    assert "were set aside by the integrity policy" in report.lines()[-1 - len(report.notes)]
    done = cli("validate", str(finished_run.toml), "--json")
    assert done.returncode == 3, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["set_aside"] == set_aside


def _tamper(output: Path, change: Any) -> tuple[Path, bytes]:
    """Rewrite a committed file of the output with ``change(table)``; return its old bytes."""
    files = sorted(committed_files(str(output)), key=lambda f: f.path)
    target = next(f for f in files if f.rows > 20)
    path = output / target.path
    original = path.read_bytes()
    pq.write_table(change(pq.read_table(path)), path)
    return path, original


def test_deleted_and_altered_rows_are_reported_exactly(finished_run: RunFixture) -> None:
    run = finished_run
    deleted: list[tuple[int, int]] = []
    altered: list[tuple[int, int]] = []

    def change(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        # Delete two rows of one partition, alter one row of the same partition later on.
        part = rows[0]["partition"]
        mine = [i for i, r in enumerate(rows) if r["partition"] == part]
        gone = {mine[3], mine[4]}
        edit = mine[10]
        for i in sorted(gone):
            deleted.append((part, rows[i]["offset"]))
        altered.append((part, rows[edit]["offset"]))
        rows[edit] = {**rows[edit], "op": "tampered"}
        kept = [r for i, r in enumerate(rows) if i not in gone]
        return pa.Table.from_pylist(kept, schema=table.schema)

    path, original = _tamper(run.output, change)
    try:
        report = validate(load_target(str(run.toml)))
        bad = [p for p in report.partitions if not p.ok]
        assert len(bad) == 1, "\n".join(report.lines())
        diff = bad[0]
        assert diff.partition == deleted[0][0]
        assert (diff.missing, diff.different, diff.extra) == (2, 1, 0)
        assert diff.first_offset == min(o for _, o in deleted + altered)

        done = cli("validate", str(run.toml), "--json")
        assert done.returncode == 1, done.stderr
        data = json.loads(done.stdout)
        assert data["totals"]["missing"] == 2 and data["totals"]["different"] == 1
        # Partitions shared by three processes (two by default, above): the report of one,
        # in the same order, as JSON and as lines.
        for flags in (["--json"], []):
            alone = cli("validate", str(run.toml), *flags, "--jobs", "1")
            shared = cli("validate", str(run.toml), *flags, "--jobs", "3")
            assert alone.returncode == 1 and alone.stdout, alone.stderr
            assert (shared.returncode, shared.stdout) == (alone.returncode, alone.stdout)
            if flags:
                assert json.loads(alone.stdout) == data

        # Compared from after the tampered offsets, the output is clean again.
        later = max(o for _, o in deleted + altered) + 1
        assert validate(load_target(str(run.toml)), from_offset=later).ok
    finally:
        path.write_bytes(original)


def test_extra_rows_are_reported(finished_run: RunFixture) -> None:
    path, original = _tamper(finished_run.output, lambda t: pa.concat_tables([t, t.slice(5, 1)]))
    try:
        report = validate(load_target(str(finished_run.toml)))
        bad = [p for p in report.partitions if not p.ok]
        assert [(p.extra, p.missing, p.different) for p in bad] == [(1, 0, 0)]
    finally:
        path.write_bytes(original)
    assert validate(load_target(str(finished_run.toml))).ok
