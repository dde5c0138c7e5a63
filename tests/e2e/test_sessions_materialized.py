"""End to end: simulator -> broker -> session-table pipeline with materializations -> both outputs.

Every materialization must equal the change log rebuilt up to its batch, and every session
that ended must have an ``end`` materialization equal to its final ground-truth table.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from tests.fixtures.sessions_job import (
    kill_9_after_a_commit,
    run_to_the_end,
    sessions_config,
    start_quiet_run,
    two_partition_simulation,
)
from tests.integration.materialize_support import check_materializations

from inorder.assemble import build_pipeline
from inorder.dev.sim_model import SimulationConfig
from inorder.dev.simulator import GroundTruth, simulate
from inorder.sessions.materializer import read_materialized
from inorder.sessions.rebuild import read_changes

EVERY = 2


def config(
    bootstrap: str, prefix: str, work: Path, trigger: str = "available-now"
) -> dict[str, Any]:
    return sessions_config(
        bootstrap,
        prefix,
        work,
        name="e2e-materialized",
        max_offsets=800,
        trigger=trigger,
        materialized={"every": EVERY, "path": str(work / "tables")},
    )


def simulation(prefix: str, seed: int, messages: int) -> SimulationConfig:
    return two_partition_simulation(
        prefix,
        seed,
        sites=2,
        sessions_per_site=15,
        rows_per_snapshot=6,
        messages=messages,
        restart_every=60,
        end_probability=0.02,
        faulty=0.2,
    )


def check_outputs(work: Path, truth: GroundTruth) -> dict[str, int]:
    changes = read_changes(str(work / "output"))
    tables = read_changes(str(work / "tables"))
    batches = int(pc.max(changes.column("batch_id")).as_py()) + 1
    counts = check_materializations(changes, tables, batches, EVERY)
    # Ended sessions: the last end materialization is their final ground-truth table.
    ends = tables.filter(pc.equal(tables.column("reason"), "end"))
    final = read_materialized(ends)
    checked = 0
    for s in truth.sessions.values():
        if not s.ended or not s.table_exact or s.table is None:
            continue
        key = (s.topic, s.session)
        assert key in final, f"{s.key} ended but has no end materialization"
        assert final[key].rows == s.table, f"{s.key}: end materialization != ground truth"
        checked += 1
    counts["ended_checked"] = checked
    counts["batches"] = batches
    return counts


def test_materializations_match_change_log_and_truth(
    kafka: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inorder.sessions.materializer import Materializer

    reports: list[Any] = []
    original = Materializer.after_commit

    def recording(self: Materializer, batch_id: int) -> Any:
        reports.append(original(self, batch_id))
        return reports[-1]

    monkeypatch.setattr(Materializer, "after_commit", recording)
    prefix = f"mat-{random.randrange(10**9)}-"
    result = simulate(simulation(prefix, seed=5, messages=3500), kafka.bootstrap_servers)
    summary = build_pipeline(config(kafka.bootstrap_servers, prefix, tmp_path)).run()
    assert summary.records == result.records
    counts = check_outputs(tmp_path, result.ground_truth)
    # Ran after every batch; each batch wrote its materializations once.
    assert [r.batch_id for r in reports] == list(range(counts["batches"]))
    assert all(r.committed == (r.sessions > 0) for r in reports)
    assert [r.rebuilt for r in reports] == [True] + [False] * (len(reports) - 1)
    assert counts["batches"] >= 5, counts
    assert counts["ended_checked"] >= 10, counts
    assert counts["periodic"] > 0 and counts["reset"] > 0, counts


@pytest.mark.slow
def test_kill_9_restarts_keep_materializations_exact(kafka: Any, tmp_path: Path) -> None:
    prefix = f"matkill-{random.randrange(10**9)}-"
    result = simulate(simulation(prefix, seed=6, messages=12000), kafka.bootstrap_servers)
    cfg = config(kafka.bootstrap_servers, prefix, tmp_path, trigger="1 second")
    cfg["source"]["max_offsets_per_trigger"] = 500
    cfg["spark"]["master"] = "local[2]"
    toml = tmp_path / "pipeline.toml"
    from inorder.commands.run import dump_toml

    toml.write_text(dump_toml(cfg))
    rng = random.Random(13)
    seen = 0
    # Two kills, each a few batches after the run's first commit (mid-stream): the second run
    # restarts beside one dead run's residue, the last beside a restarted one's; a crash loop
    # of several dead attempts in a row is tests/faults' (test_crash_loop_within_one_batch).
    for _ in range(2):
        seen = kill_9_after_a_commit(
            start_quiet_run(toml, tmp_path), tmp_path / "output", seen, rng, 4.0
        )
    # What is left is drained in large batches: the kills above are what this test is about,
    # and the restarted run re-runs the killed batch from Spark's log at its planned size.
    done = run_to_the_end(
        toml, "--quiet", "--set", "source.max_offsets_per_trigger=100000", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counts = check_outputs(tmp_path, result.ground_truth)
    assert counts["ended_checked"] >= 10, counts
