"""End to end: simulator -> broker -> session-table pipeline -> Parquet, checked against truth."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.fixtures.sessions_job import (
    RESTART_SESSION,
    assert_matches_truth,
    kill_9_after_a_commit,
    run_to_the_end,
    sessions_config,
    start_quiet_run,
    two_partition_simulation,
)

from inorder.assemble import build_pipeline
from inorder.dev.sim_model import SimulationConfig
from inorder.dev.simulator import simulate
from inorder.pipeline.progress import BatchProgress
from inorder.pipeline.runner import PipelineRunner
from inorder.sessions.rebuild import read_changes

ROOT = Path(__file__).resolve().parents[2]


def pipeline_config(bootstrap: str, prefix: str, work: Path) -> dict[str, Any]:
    """A session-table pipeline over the topics of one simulation, a batch every second."""
    return sessions_config(
        bootstrap,
        prefix,
        work,
        name="e2e",
        max_offsets=4000,
        trigger="1 second",
        discovery_interval="1 second",
        integrity=RESTART_SESSION,
    )


#: The sizes of the simulations of these tests, unless one says otherwise.
SIZES = {"sites": 3, "sessions_per_site": 20, "messages": 6000, "restart_every": 150}


def simulation(prefix: str, seed: int, faulty: float = 0.0, **sizes: int) -> SimulationConfig:
    return two_partition_simulation(
        prefix, seed, faulty=faulty, rows_per_snapshot=8, **(SIZES | sizes)
    )


class RecordCounter:
    """A run observer counting the records of finished micro-batches."""

    def __init__(self) -> None:
        self.records = 0
        self.seconds: list[dict[str, float]] = []

    def on_start(self) -> None:
        pass

    def on_batch(self, progress: BatchProgress, lag_by_partition: dict[str, int] | None) -> None:
        self.records += progress.records
        if progress.records:
            self.seconds.append(progress.seconds)

    def on_failure(self, error: BaseException) -> None:
        pass

    def on_stop(self) -> None:
        pass


def only_topics(changes: pa.Table, prefix: str, *, matching: bool = True) -> pa.Table:
    mask = pc.starts_with(changes.column("topic"), prefix)
    return changes.filter(mask if matching else pc.invert(mask))


def test_session_tables_match_truth_with_late_site_and_faults(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    prefix = f"e2e-{random.randrange(10**9)}-"
    # Hundreds of sessions, restarts every 30 messages of a session, a fifth of them faulty.
    first = simulate(
        simulation(
            prefix, seed=1, faulty=0.2, sessions_per_site=70, messages=12000, restart_every=30
        ),
        kafka.bootstrap_servers,
    )
    assert len(first.ground_truth.sessions) >= 200
    config = pipeline_config(kafka.bootstrap_servers, prefix, tmp_path)
    counter = RecordCounter()
    runner = PipelineRunner(
        dataclasses.replace(build_pipeline(config), observers=[counter]), handle_signals=False
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["summary"] = runner.run()
        except BaseException as exc:  # reported by the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait_for_records(n: int) -> None:
        deadline = time.monotonic() + 300
        while counter.records < n:
            assert thread.is_alive(), f"the run ended early: {outcome}"
            assert time.monotonic() < deadline, f"{counter.records} of {n} records processed"
            time.sleep(0.5)

    try:
        wait_for_records(first.records)
        # A site that appears while the query runs is discovered by the pattern, from offset 0.
        late = simulate(
            simulation(f"{prefix}late-", seed=2, sites=1, messages=1500), kafka.bootstrap_servers
        )
        wait_for_records(first.records + late.records)
    finally:
        runner.stop()
        thread.join(120)
    assert "error" not in outcome, outcome.get("error")
    summary = outcome["summary"]
    assert summary.records == first.records + late.records
    assert summary.violations, "injected faults must show as integrity events"
    # Where each batch's time went: the backend's phases and Spark's own steps.
    for seconds in counter.seconds:
        assert seconds["apply"] > 0 and seconds["tasks"] > 0 and seconds["commit"] >= 0, seconds
        assert seconds["spark_triggerExecution"] >= seconds["tasks"], seconds
    changes = read_changes(str(tmp_path / "output"))
    assert_matches_truth(only_topics(changes, f"{prefix}late-", matching=False), first.ground_truth)
    late_changes = only_topics(changes, f"{prefix}late-")
    assert pc.min(late_changes.column("offset")).as_py() == 0
    assert_matches_truth(late_changes, late.ground_truth)


@pytest.mark.slow
@pytest.mark.parametrize("state_deltas", ["partition", "task"])
def test_kill_9_restarts_stay_exact(kafka: Any, tmp_path: Path, state_deltas: str) -> None:
    prefix = f"kill-{random.randrange(10**9)}-"
    result = simulate(
        simulation(prefix, seed=3, faulty=0.2, messages=8000), kafka.bootstrap_servers
    )
    config = pipeline_config(kafka.bootstrap_servers, prefix, tmp_path)
    # Small batches: 40 micro-batches of at least 1 s, so every kill lands mid-stream (a run
    # is killed within 4.5 s of its first commit: 6 batches each at most, 12 in all).
    config["source"]["max_offsets_per_trigger"] = 200
    config["spark"]["master"] = "local[2]"
    # State deltas as a file per partition (format 2) and as one file per task (format 3).
    config["pipeline"]["state_deltas"] = state_deltas
    toml = tmp_path / "pipeline.toml"
    from inorder.commands.run import dump_toml

    toml.write_text(dump_toml(config))
    rng = random.Random(11)
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
        toml, "--progress", "json", "--set", "source.max_offsets_per_trigger=100000", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    final = [e for e in events if e["event"] == "summary"][-1]
    assert 0 < final["records"] < result.records, "the last kill must land before the end"
    assert_matches_truth(tmp_path / "output", result.ground_truth)
    task_files = list(tmp_path.rglob("state/_deltas/*.arrow"))
    partition_deltas = list(tmp_path.rglob("state/*/*/*.delta.*"))
    assert bool(task_files) == (state_deltas == "task") != bool(partition_deltas)
