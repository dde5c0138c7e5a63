"""A Python process that starts too slowly for Spark: the query starts again, exactly once.

Spark waits a fixed 10 s (``PythonWorkerFactory``, not configurable) for each Python process
it starts without its daemon (a Python data source's planner, the streaming source's runner)
to connect back, then fails the query with "Python worker failed to connect back". On a busy
machine starting Python takes that long. The stand-in for a busy machine is ``PYSPARK_PYTHON``
set to a wrapper that delays the first start of the streaming source's runner past that bound;
every other start is the interpreter's own. The run must start the query again from its
checkpoint, say so, and end exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.faults.conftest import MatrixRecorder
from tests.faults.test_process_faults import RUN_TIMEOUT, child_env, exact_check, make_job

#: The module Spark runs for a Python streaming source's planner, once per query start.
SLOW_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
#: Past Spark's 10 s: the JVM has given up on the process by then.
DELAY_SECONDS = 15

WRAPPER = """#!/usr/bin/env bash
# Every start is logged; the first start of $SLOW_MODULE waits past Spark's connect-back bound.
echo "$*" >> "{log}"
case " $* " in
  *" -m {module} "*) if mkdir "{once}" 2>/dev/null; then sleep {delay}; fi ;;
esac
exec "{python}" "$@"
"""


def test_a_python_start_past_sparks_bound_restarts_the_query(
    kafka: Any, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    prefix = f"slow-{uuid.uuid4().hex[:8]}-"
    job = make_job(kafka.bootstrap_servers, tmp_path, prefix=prefix, seed=31, messages=1200)
    log, once = tmp_path / "python-starts.log", tmp_path / "delayed-once"
    wrapper = tmp_path / "slow-python"
    wrapper.write_text(
        WRAPPER.format(
            log=log, module=SLOW_MODULE, once=once, delay=DELAY_SECONDS, python=sys.executable
        )
    )
    wrapper.chmod(0o755)
    env = {**child_env(), "PYSPARK_PYTHON": str(wrapper)}
    command = [sys.executable, "-m", "inorder.cli", "run", str(job.toml), "--progress", "json"]
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    starts = log.read_text().splitlines() if log.exists() else []
    runner_starts = sum(f"-m {SLOW_MODULE}" in line for line in starts)
    assert once.exists(), f"the wrapper never saw {SLOW_MODULE}: {starts}"
    assert runner_starts >= 2, f"the query was not started again: {starts}"
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    infos = [str(e.get("message", "")) for e in events if e.get("event") == "info"]
    notes = [x for x in infos if "did not connect back" in x]
    ok, check = exact_check(job)
    matrix.record(
        group="process",
        fault="a Python process Spark starts (the streaming source's runner) starts past "
        "Spark's fixed 10 s connect-back bound",
        times=1,
        outcome="continued" if done.returncode == 0 else "named error",
        ok=ok and done.returncode == 0 and len(notes) == 1,
        check=f"exit {done.returncode}; the run said {notes[:1]!r} and started the query "
        f"again; {check}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(notes) == 1 and "start 2 of 3" in notes[0], infos
    assert ok, check
