"""`inorder run` stops cleanly on SIGINT/SIGTERM between triggers and the next run resumes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from inorder.commands.run import dump_toml
from inorder.dev.sim_model import SimulationConfig
from inorder.dev.simulator import simulate
from inorder.dev.verify import verify_tables
from inorder.pipeline.config import validate
from inorder.sessions.rebuild import read_changes, rebuild_tables


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_signal_stops_cleanly_and_next_run_resumes(
    kafka: Any, tmp_path: Path, signum: signal.Signals
) -> None:
    prefix = f"sig-{random.randrange(10**9)}-"
    truth = simulate(
        SimulationConfig(
            sites=1,
            topic_prefix=prefix,
            partitions=2,
            sessions_per_site=4,
            rows_per_snapshot=5,
            messages=3000,
            restart_every=100,
            seed=9,
        ),
        kafka.bootstrap_servers,
    ).ground_truth
    config = validate(
        {
            "pipeline": {
                "checkpoint": str(tmp_path / "ckpt"),
                "trigger": "1 second",
                "progress": "json",
            },
            "source": {
                "bootstrap_servers": kafka.bootstrap_servers,
                "topic_pattern": f"{prefix}.*",
                "max_offsets_per_trigger": 500,
            },
            "processor": {"type": "sessions"},
            "sink": {"path": str(tmp_path / "out")},
            "spark": {"master": "local[2]"},
        }
    )
    toml = tmp_path / "p.toml"
    toml.write_text(dump_toml(config))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        [sys.executable, "-m", "inorder.cli", "run", str(toml)],
        env=env,
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
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "inorder.cli",
            "run",
            str(toml),
            "--trigger",
            "available-now",
            "--quiet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    changes = read_changes(str(tmp_path / "out"))
    keys = list(
        zip(
            *(
                changes.column(c).to_pylist()
                for c in ("topic", "partition", "offset", "row_id", "op")
            ),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys))
    assert verify_tables(rebuild_tables(changes), truth, changes).ok
