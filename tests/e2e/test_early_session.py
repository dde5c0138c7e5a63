"""`inorder run` starts the Spark session beside its pre-flight checks, and a refused start stays
one line that leaves no JVM behind.

Before, the JVM was launched only after every check (about a second of imports and checks
first); and the JVM's own standard error (Java's "Using incubator modules" warning at every
start) reached the terminal. Here the broker never answers, so the check waits its 10 s while
the session starts: the JVM must appear during that wait, the run must still be refused with
its one line, and the JVM must be gone once the command has exited.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def _dead_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _jvms(pid: int) -> list[psutil.Process]:
    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            if child.name() == "java":
                found.append(child)
        except psutil.Error:  # exited in between
            continue
    return found


def test_a_refused_start_had_its_session_starting_and_leaves_no_jvm(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ck"
    command = [
        sys.executable,
        "-m",
        "inorder.cli",
        "run",
        str(ROOT / "examples" / "sessions.toml"),
        "--master",
        "local[1]",
        "--set",
        f"source.bootstrap_servers=127.0.0.1:{_dead_port()}",
        "--set",
        f"pipeline.checkpoint={checkpoint}",
        "--set",
        f"sink.path={tmp_path / 'out'}",
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    jvm: psutil.Process | None = None
    deadline = time.monotonic() + 8  # the broker check waits 10 s
    while jvm is None and time.monotonic() < deadline and run.poll() is None:
        found = _jvms(run.pid)
        jvm = found[0] if found else None
        time.sleep(0.05)
    _, stderr = run.communicate(timeout=120)

    assert jvm is not None, "no JVM was started while the broker check waited"
    assert run.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "no broker answered" in lines[0], stderr
    _, alive = psutil.wait_procs([jvm], timeout=30)
    assert not alive, "the JVM outlived the refused run"
    # What the JVM printed itself went to the run's log, not to the terminal.
    assert (checkpoint / "inorder-run.log").exists()
