"""`inorder run` stops cleanly on SIGINT/SIGTERM between triggers and the next run resumes."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from tests.fixtures.sessions_job import (
    TWO_LOCAL_CORES,
    assert_matches_truth,
    run_command,
    run_to_the_end,
    sessions_config,
    spark_child_env,
    two_partition_simulation,
)

from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_signal_stops_cleanly_and_next_run_resumes(
    kafka: Any, tmp_path: Path, signum: signal.Signals
) -> None:
    prefix = f"sig-{random.randrange(10**9)}-"
    simulation = two_partition_simulation(
        prefix, 9, sessions_per_site=4, rows_per_snapshot=5, messages=3000, restart_every=100
    )
    truth = simulate(simulation, kafka.bootstrap_servers).ground_truth
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        max_offsets=500,
        trigger="1 second",
        progress="json",
        sink={"path": str(tmp_path / "out")},
        spark=TWO_LOCAL_CORES,
    )
    toml = tmp_path / "p.toml"
    toml.write_text(dump_toml(config))
    proc = subprocess.Popen(
        run_command(toml),
        env=spark_child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    for line in proc.stdout:  # wait for the first batch with data
        if '"event": "batch"' in line and json.loads(line)["records"] > 0:
            break
        assert time.monotonic() < deadline, "no batch with data"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]
    assert "stopping after the current batch" in out + err
    # The next run (until caught up) resumes where the first stopped: exact, no duplicates.
    done = run_to_the_end(toml, "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_matches_truth(tmp_path / "out", truth)
