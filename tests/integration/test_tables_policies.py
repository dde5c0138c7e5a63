"""The session tables follow the change log under every integrity policy, faults included.

A policy decides which change rows reach the change log (dead_letter moves a bad record aside,
restart_session resets its session, fail stops the run). Whatever it
decided, the current table must be the change log rebuilt, the history table must answer
as-of queries as the change log does, and ``inorder validate``'s check of the tables must be
clean: after a run that finished, and after one that stopped at its first violation.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tests.fixtures.sessions_job import FAULTS_WITHOUT_SWAPS, sessions_config
from tests.fixtures.sessions_job import two_partition_simulation as simulation
from tests.integration.test_session_tables import check_history, current_tables, non_empty

from inorder.assemble import build_pipeline
from inorder.checkpoint.layout import CheckpointLayout
from inorder.dev.simulator import simulate
from inorder.errors import InorderError
from inorder.sessions import rebuild_tables
from inorder.sessions.rebuild import read_changes
from inorder.sessions.tables_check import check_pipeline_tables
from inorder.sinks.parquet import read_committed


@pytest.mark.parametrize("policy", ["dead_letter", "restart_session", "fail"])
def test_tables_follow_the_change_log_under_each_policy(
    policy: str, kafka: Any, spark: Any, tmp_path: Path
) -> None:
    prefix = f"tpol-{policy[:4]}-{random.randrange(10**9)}-"
    tables = {"current": str(tmp_path / "current"), "history": str(tmp_path / "history")}
    config = sessions_config(
        kafka.bootstrap_servers, prefix, tmp_path, max_offsets=400, tables=tables,
        integrity={"on_violation": policy}, discovery_interval="1 second",
    )  # fmt: skip
    # Clean sessions first (committed to both tables), then sessions with faults.
    for part, faulty in (("a", 0.0), ("b", 0.5)):
        sim = simulation(
            prefix + part, 41, sites=2, sessions_per_site=6, rows_per_snapshot=4,
            messages=1200, restart_every=60, end_probability=0.02, faulty=faulty,
            faults=FAULTS_WITHOUT_SWAPS,
        )  # fmt: skip
        simulate(sim, kafka.bootstrap_servers)
        if policy == "fail" and faulty:
            with pytest.raises(InorderError, match="integrity violation"):
                build_pipeline(config).run()
        else:
            assert build_pipeline(config).run().stopped_because == "caught up"

    changes = read_changes(str(tmp_path / "output"))
    assert changes.num_rows > 0
    if policy == "restart_session":
        assert "reset" in set(changes.column("op").to_pylist())
    if policy == "dead_letter":
        assert read_committed(str(tmp_path / "output_dead_letter")).num_rows > 0
    expected = non_empty(rebuild_tables(changes))
    assert current_tables(tables["current"], None) == expected
    assert check_history(changes, tables["history"], None, 25) == 25
    owner = (CheckpointLayout.of(str(tmp_path / "checkpoint")).read_info() or {})["id"]
    checked = check_pipeline_tables(build_pipeline(config), owner)
    assert checked is not None and checked.ok, checked.lines() if checked else None
