"""``inorder repair``: output and checkpoint out of step -> repair -> run equals the truth."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.fixtures.sessions_job import (
    RESTART_SESSION,
    TWO_LOCAL_CORES,
    check_truth,
    sessions_config,
    small_simulation,
)

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint.layout import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.dev.sim_model import SimulationConfig
from inorder.dev.simulator import simulate
from inorder.errors import InorderError
from inorder.ops.repair import apply_repair, plan_repair
from inorder.ops.sessionspans import SpanTracker
from inorder.ops.target import OpsTarget
from inorder.ops.validate import validate
from inorder.pipeline.runner import PipelineRunner
from inorder.sessions.rebuild import read_changes

# -- pure: where a partition can restart -----------------------------------------------------


def test_cut_goes_back_to_the_earliest_start_of_straddling_sessions() -> None:
    t = SpanTracker()
    t.record("a", 0, starts=True, present_after=True)  # a: 0..
    t.record("b", 1, starts=True, present_after=True)  # b: 1..5 (ends)
    t.record("a", 2, starts=False, present_after=True)
    t.record("a", 3, starts=False, present_after=False)  # a ended at 3
    t.record("c", 4, starts=True, present_after=True)  # c: 4.. (live)
    t.record("b", 5, starts=False, present_after=False)
    t.record("c", 6, starts=False, present_after=True)
    # Live at 7: c (since 4); b straddles 4 (1..5): back to 1; a straddles 1 (0..3): back to 0.
    assert t.cut(7).offset == 0
    # Only c live at 7 if a were not there: a fresh tracker without a.
    u = SpanTracker()
    u.record("b", 1, starts=True, present_after=True)
    u.record("b", 3, starts=False, present_after=False)
    u.record("c", 4, starts=True, present_after=True)
    u.record("c", 6, starts=False, present_after=True)
    cut = u.cut(7)
    assert (cut.offset, cut.key, cut.open_keys) == (4, "c", 1)
    assert u.cut(4).offset == 4  # nothing straddles 4: b ended at 3
    assert u.cut(3).offset == 1  # 3 is inside b's session


def test_a_new_snapshot_restarts_the_lifetime() -> None:
    t = SpanTracker()
    t.watch = "s"
    t.record("s", 10, starts=True, present_after=True)
    t.record("s", 11, starts=False, present_after=True)
    t.record("s", 20, starts=True, present_after=True)  # a producer restart: new snapshot
    t.record("s", 21, starts=False, present_after=True)
    assert t.cut(30).offset == 20
    assert t.cut(20).offset == 20
    assert t.cut(15).offset == 15  # between the two sessions: nothing depends on 11
    assert t.cut(11).offset == 10
    assert t.latest_start("s") == 20
    t.dropped("s")  # e.g. an inactivity timeout dropped it after 21
    assert t.cut(30).offset == 30


# -- end to end ------------------------------------------------------------------------------


def session_config(bootstrap: str, prefix: str, work: Path, sink: dict[str, Any]) -> dict[str, Any]:
    """A session-table pipeline in several small batches."""
    return sessions_config(
        bootstrap,
        prefix,
        work,
        name="repair",
        max_offsets=400,
        integrity=RESTART_SESSION,
        sink=sink,
        spark=TWO_LOCAL_CORES,
    )


def simulation(prefix: str, seed: int, faulty: float) -> SimulationConfig:
    return small_simulation(prefix, seed, faulty, messages=1600, restart_every=90)


def run(config: dict[str, Any], batches: int | None = None) -> None:
    PipelineRunner(build_pipeline(config), stop_after_batches=batches).run()


def lose_state(checkpoint: Path) -> None:
    """The crash: the engine state of every topic-partition is gone, Spark's logs are intact.

    Every partition, not one: with sessions restarting often, one partition's next messages
    may all be new snapshots, and then its loss does no visible harm (seen now and then).
    """
    state = checkpoint / "engine" / "state"
    for victim in sorted(p for p in state.glob("*/*") if p.is_dir()):
        shutil.rmtree(victim)
    shutil.rmtree(state / "_deltas", ignore_errors=True)  # the task files (state format 3)


def snapshot(*roots: Path) -> dict[str, bytes]:
    return {
        str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()
    }


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("faulty", [0.0, 0.3], ids=["clean", "faulty-sessions"])
def test_repair_after_lost_state_restores_the_truth(
    kafka: Any, spark: Any, tmp_path: Path, faulty: float
) -> None:
    prefix = f"repair-{random.randrange(10**9)}-"
    sim = simulate(simulation(prefix, seed=7, faulty=faulty), kafka.bootstrap_servers)
    output = tmp_path / "output"
    config = session_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        {"path": str(output), "partition_by": ["topic"]},
    )
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    checkpoint = tmp_path / "checkpoint"

    run(config, batches=2)
    lose_state(checkpoint)
    # The pipeline carries on with empty state for that partition: wrong output from there.
    run(config)
    assert check_truth(read_changes(str(output)), sim.ground_truth), "the crash did no harm"
    owner = CheckpointLayout.of(checkpoint).read_info()["id"]  # type: ignore[index]

    # The plan changes nothing, on disk or in the output.
    before = snapshot(output, checkpoint)
    done = cli("repair", str(toml), "--validate", "--json")
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    assert not planned["applied"] and not planned["nothing_to_do"]
    assert planned["rows_to_delete"] > 0
    assert snapshot(output, checkpoint) == before

    target = load_target(str(toml))
    plan = apply_repair(target, plan_repair(target, use_validate=True))
    assert plan.applied and plan.backup is not None and Path(plan.backup).is_dir()
    assert plan.outputs[0].rows == planned["rows_to_delete"]
    info = CheckpointLayout.of(checkpoint).read_info()
    assert info is not None and info["id"] == owner
    assert info["batch_offset"] == plan.batch_offset > 0
    assert info["startingOffsets"] == planned["starting_offsets"]

    # Applying again finds nothing to do and changes nothing.
    after = snapshot(output, checkpoint)
    again = cli("repair", str(toml), "--apply")
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    assert snapshot(output, checkpoint) == after

    run(config)
    problems = check_truth(read_changes(str(output)), sim.ground_truth)
    assert not problems, "\n".join(problems[:20])
    changes = read_changes(str(output))
    assert max(changes.column("batch_id").to_pylist()) >= plan.batch_offset

    # validate and inspect know the output numbers this checkpoint's batches from the offset:
    # the output's last batch is found in the new checkpoint's log (not "missing from it").
    checked = validate(load_target(str(toml)))
    assert checked.ok, checked.lines()
    assert any("repaired" in n for n in checked.notes), checked.notes
    assert not any("does not hold" in n for n in checked.notes), checked.notes
    shown = cli("inspect", str(toml), "--batches")
    assert shown.returncode == 0, shown.stderr
    assert f"(output {plan.batch_offset})" in shown.stdout


def test_unfinished_repair_blocks_the_run(kafka: Any, spark: Any, tmp_path: Path) -> None:
    prefix = f"repair-pending-{random.randrange(10**9)}-"
    simulate(simulation(prefix, seed=8, faulty=0.0), kafka.bootstrap_servers)
    config = session_config(
        kafka.bootstrap_servers, prefix, tmp_path, {"path": str(tmp_path / "output")}
    )
    run(config, batches=1)
    checkpoint = tmp_path / "checkpoint"
    info = CheckpointLayout.of(checkpoint).read_info()
    assert info is not None
    (checkpoint / "inorder-checkpoint.json").write_text(json.dumps({**info, "repair_pending": {}}))
    with pytest.raises(InorderError, match="repair was started"):
        run(config)


def test_delta_on_s3_repair_right_after_the_crash(
    kafka: Any, spark: Any, s3: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    prefix = f"repair-delta-{random.randrange(10**9)}-"
    sim = simulate(simulation(prefix, seed=9, faulty=0.0), kafka.bootstrap_servers)
    table_uri = s3.new_prefix()
    opts = s3.storage_options()
    config = session_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        {"type": "delta", "path": table_uri, "storage_options": opts},
    )
    checkpoint = tmp_path / "checkpoint"
    run(config, batches=2)
    lose_state(checkpoint)  # noticed before the pipeline ran again

    # Default failure point: the end of the last committed batch.
    target = OpsTarget(build_pipeline(config))
    plan = apply_repair(target, plan_repair(target))
    assert plan.applied and plan.outputs[0].rows > 0
    assert all(p.reason.startswith("end of batch") for p in plan.partitions), plan.lines()
    owner = CheckpointLayout.of(checkpoint).read_info()["id"]  # type: ignore[index]
    table = DeltaTable(table_uri, storage_options=opts)
    # The DELETE kept the query's application transaction; the new ids continue after it.
    assert table.transaction_version(f"inorder-{owner}") == plan.batch_offset - 1
    again = plan_repair(OpsTarget(build_pipeline(config)))
    assert again.nothing_to_do, again.lines()

    run(config)
    problems = check_truth(read_changes(table_uri, opts), sim.ground_truth)
    assert not problems, "\n".join(problems[:20])
