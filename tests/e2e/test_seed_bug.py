"""The seed's bug: vanilla Spark reorders a session's messages and leaves stuck rows.

The vanilla job (inorder's source, ``applyInPandasWithState`` trusting the order Spark hands
it, sorts forced to spill) rebuilds wrong tables — rows deleted and then re-inserted, or
updates applied out of order — on the very input where inorder's session tables are exact.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from tests.fixtures.sessions_job import (
    sessions_config,
    spark_child_env,
    two_partition_simulation,
    verify_changes,
)

from inorder.assemble import build_pipeline
from inorder.dev.simulator import simulate
from inorder.dev.verify import verify_tables
from inorder.sessions.rebuild import read_changes, rebuild_tables

SCRIPT = Path(__file__).parents[2] / "examples" / "vanilla_seed_bug.py"


def test_vanilla_leaves_stuck_rows_where_inorder_is_exact(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    prefix = f"seed-{random.randrange(10**9)}-"
    simulation = two_partition_simulation(
        prefix, 13, sessions_per_site=6, rows_per_snapshot=10, messages=6000, restart_every=0
    )
    truth = simulate(simulation, kafka.bootstrap_servers).ground_truth
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            kafka.bootstrap_servers,
            f"{prefix}.*",
            str(tmp_path / "vanilla"),
            str(tmp_path / "vanilla-ckpt"),
        ],
        env=spark_child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    vanilla = ds.dataset(str(tmp_path / "vanilla"), format="parquet").to_table()
    vanilla_check = verify_tables(rebuild_tables(vanilla), truth)
    assert vanilla_check.mismatched, "vanilla Spark kept the order this time: no stuck rows"

    sink = {"path": str(tmp_path / "out")}
    config = sessions_config(kafka.bootstrap_servers, prefix, tmp_path, sink=sink)
    build_pipeline(config).run()
    changes = read_changes(str(tmp_path / "out"))
    check = verify_changes(changes, truth)
    assert check.ok and check.exact == check.sessions, "\n".join(check.lines())
