"""Problems found before the first batch: one line naming the problem, exit code 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inorder.commands.run import dump_toml
from inorder.pipeline.config import validate


def write_pipeline(
    tmp_path: Path, bootstrap: str, sink: str, checkpoint: str, pattern: str
) -> Path:
    config = validate(
        {
            "pipeline": {"checkpoint": checkpoint, "trigger": "available-now"},
            "source": {"bootstrap_servers": bootstrap, "topic_pattern": pattern},
            "processor": {"type": "sessions"},
            "sink": {"path": sink},
        }
    )
    path = tmp_path / "p.toml"
    path.write_text(dump_toml(config))
    return path


def run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", "run", str(path)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("problem", ["broker", "sink", "checkpoint"])
def test_startup_problem_is_one_line_exit_2(kafka: Any, tmp_path: Path, problem: str) -> None:
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    (readonly / "file").write_text("not a directory")
    bootstrap = "127.0.0.1:1" if problem == "broker" else kafka.bootstrap_servers
    sink = str(readonly / "file" / "out") if problem == "sink" else str(tmp_path / "out")
    checkpoint = str(readonly / "file" / "ck") if problem == "checkpoint" else str(tmp_path / "ck")
    # A topic the pattern matches: under available-now a pattern matching nothing is itself
    # refused, before the sink or the checkpoint would be looked at.
    topic = kafka.new_topic()
    done = run(write_pipeline(tmp_path, bootstrap, sink, checkpoint, re.escape(topic)))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    expected = {"broker": "127.0.0.1:1", "sink": "out", "checkpoint": "checkpoint"}[problem]
    assert expected in lines[0]
