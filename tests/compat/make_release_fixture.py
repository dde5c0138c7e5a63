"""Write the checkpoint and output of a released inorder, for the resume test.

Run it with the released code first on the path, from a checkout of that release. An
editable install of the current code shadows ``PYTHONPATH``, so use an interpreter that sees
the dependencies but not that install, e.g. for 0.1.0::

    git worktree add /tmp/inorder-0.1.0 <commit of 0.1.0>
    python3.11 -m venv /tmp/oldvenv
    echo "$PWD/.venv/lib/python3.11/site-packages" \
        > /tmp/oldvenv/lib/python3.11/site-packages/deps.pth
    export PYTHONPATH=/tmp/inorder-0.1.0/src PYSPARK_PYTHON=/tmp/oldvenv/bin/python
    /tmp/oldvenv/bin/python tests/compat/make_release_fixture.py tests/compat/inorder-0.1.0.tar.gz

It starts a broker (``inorder dev up --only kafka``), publishes the simulation of
:data:`SIMULATION` (deterministic: the same records at the same offsets every time), runs the
session pipeline for two micro-batches with the released code, and archives the pipeline
file, checkpoint and output. ``tests/integration/test_release_compat.py`` publishes the same
simulation and resumes the archive with the current code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

#: Shared with the resume test (kept literal here: the released code does not have this file).
SIMULATION = {
    "sites": 2,
    "topic_prefix": "compat-site-",
    "partitions": 2,
    "sessions_per_site": 5,
    "rows_per_snapshot": 5,
    "messages": 1600,
    "restart_every": 90,
    "seed": 11,
}
PIPELINE_TOML = """[pipeline]
name = "compat"
checkpoint = "ck"
trigger = "available-now"
progress = "quiet"

[source]
bootstrap_servers = "{bootstrap}"
topic_pattern = "compat-site-.*"
max_offsets_per_trigger = 500

[processor]
type = "sessions"

[integrity]
on_violation = "restart_session"

[sink]
path = "out"
partition_by = ["topic"]

[spark]
master = "local[2]"
"""


def main(target: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="inorder-compat-"))
    cli = [sys.executable, "-m", "inorder.cli"]
    state = work / "dev"
    up = subprocess.run(
        [
            *cli,
            "dev",
            "up",
            "--only",
            "kafka",
            "--kafka-port",
            "0",
            "--state-dir",
            str(state),
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    bootstrap = json.loads(up.stdout)["services"]["kafka"]["bootstrap_servers"]
    try:
        from inorder.dev.sim_model import SimulationConfig
        from inorder.dev.simulator import simulate

        simulate(SimulationConfig(**SIMULATION), bootstrap)  # type: ignore[arg-type]
        job = work / "job"
        job.mkdir()
        (job / "pipeline.toml").write_text(PIPELINE_TOML.format(bootstrap=bootstrap))
        subprocess.run(
            [*cli, "run", "pipeline.toml", "--stop-after-batches", "2"], cwd=job, check=True
        )
        (job / "pipeline.toml").write_text(PIPELINE_TOML.format(bootstrap="BOOTSTRAP"))
        with tarfile.open(target, "w:gz") as archive:
            for name in ("pipeline.toml", "ck", "out"):
                archive.add(job / name, arcname=name)
    finally:
        subprocess.run([*cli, "dev", "down", "--state-dir", str(state)], check=False)


if __name__ == "__main__":
    main(sys.argv[1])
