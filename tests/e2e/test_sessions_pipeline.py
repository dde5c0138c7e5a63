"""End to end: simulator -> broker -> session-table pipeline -> Parquet, checked against truth."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from inorder.dev.sim_model import FaultRates, SimulationConfig
from inorder.dev.simulator import GroundTruth, simulate
from inorder.dev.verify import verify_tables
from inorder.pipeline.config import build_pipeline, validate
from inorder.sessions.rebuild import read_changes, rebuild_tables

ROOT = Path(__file__).resolve().parents[2]


def pipeline_config(bootstrap: str, prefix: str, work: Path, **pipeline: Any) -> dict[str, Any]:
    """A session-table pipeline over the topics of one simulation."""
    return validate(
        {
            "pipeline": {
                "name": "e2e",
                "checkpoint": str(work / "checkpoint"),
                "trigger": "available-now",
                "progress": "quiet",
                **pipeline,
            },
            "source": {
                "bootstrap_servers": bootstrap,
                "topic_pattern": f"{prefix}.*",
                "max_offsets_per_trigger": 4000,
                "topic_discovery_interval": "1 second",
            },
            "processor": {"type": "sessions"},
            "integrity": {"on_violation": "restart_session"},
            "sink": {"path": str(work / "output"), "partition_by": ["topic"]},
        }
    )


def simulation(prefix: str, seed: int, faulty: float = 0.0, **extra: Any) -> SimulationConfig:
    return SimulationConfig(
        sites=extra.pop("sites", 3),
        topic_prefix=prefix,
        partitions=2,
        sessions_per_site=extra.pop("sessions_per_site", 20),
        rows_per_snapshot=8,
        messages=extra.pop("messages", 6000),
        restart_every=extra.pop("restart_every", 150),
        faults=FaultRates(drop=0.01, duplicate=0.01, swap=0.01, malformed=0.01)
        if faulty
        else FaultRates(),
        faulty_sessions=faulty,
        seed=seed,
        **extra,
    )


def assert_matches_truth(output: Path, truth: GroundTruth) -> None:
    changes = read_changes(str(output))
    keys = list(
        zip(
            changes.column("topic").to_pylist(),
            changes.column("partition").to_pylist(),
            changes.column("offset").to_pylist(),
            changes.column("row_id").to_pylist(),
            changes.column("op").to_pylist(),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys)), "duplicate change rows"
    check = verify_tables(rebuild_tables(changes), truth, changes)
    assert check.ok, "\n".join(check.lines())
    assert check.exact + check.unknown == check.sessions


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
    summary = build_pipeline(config).run()
    assert summary.records == first.records
    assert summary.violations, "injected faults must show as integrity events"
    assert_matches_truth(tmp_path / "output", first.ground_truth)

    # A site that appears later is discovered by the pattern on the next run, from offset 0.
    late = simulate(
        simulation(f"{prefix}late-", seed=2, sites=1, messages=1500), kafka.bootstrap_servers
    )
    summary = build_pipeline(config).run()
    assert summary.records == late.records
    changes = read_changes(str(tmp_path / "output"))
    late_rows = changes.filter(pc.starts_with(changes.column("topic"), f"{prefix}late-"))
    assert pc.min(late_rows.column("offset")).as_py() == 0


@pytest.mark.slow
def test_kill_9_restarts_stay_exact(kafka: Any, tmp_path: Path) -> None:
    prefix = f"kill-{random.randrange(10**9)}-"
    result = simulate(
        simulation(prefix, seed=3, faulty=0.2, messages=20000), kafka.bootstrap_servers
    )
    config = pipeline_config(kafka.bootstrap_servers, prefix, tmp_path, trigger="1 second")
    config["source"]["max_offsets_per_trigger"] = 1500
    config["spark"]["master"] = "local[2]"
    toml = tmp_path / "pipeline.toml"
    from inorder.commands.run import dump_toml

    toml.write_text(dump_toml(config))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    rng = random.Random(11)
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "inorder.cli", "run", str(toml), "--quiet"],
            env=env,
            start_new_session=True,
            cwd=tmp_path,
        )
        time.sleep(rng.uniform(20, 35))
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
        proc.wait()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "inorder.cli",
            "run",
            str(toml),
            "--quiet",
            "--trigger",
            "available-now",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert_matches_truth(tmp_path / "output", result.ground_truth)
