"""`inorder run` stops cleanly on SIGINT/SIGTERM between triggers and the next run resumes."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from confluent_kafka import Producer
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
from inorder.pipeline.config import validate
from inorder.sinks.parquet import read_committed

ROOT = Path(__file__).resolve().parents[2]


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
    # The next run (until caught up) resumes where the first stopped: exact, no duplicates. It
    # reads the rest in large batches: the stop is what this test is about.
    done = run_to_the_end(toml, "--quiet", "--set", "source.max_offsets_per_trigger=100000")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_matches_truth(tmp_path / "out", truth)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, key=b"k", value=value)
    producer.flush(30)


class _Events:
    """A run's JSON progress events as they come (read by a thread: a wait never hangs)."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            if line.startswith("{"):
                self._queue.put(json.loads(line))
        self._queue.put(None)  # the run closed its output

    def next(self, wanted: Callable[[dict[str, Any]], bool], deadline: float) -> dict[str, Any]:
        """The next event ``wanted`` picks; fails when the output ends or time is up first."""
        while True:
            event = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            assert event is not None, f"the run ended first; its events: {self.seen}"
            self.seen.append(event)
            if wanted(event):
                return event


def _wait_for(path: Path, proc: subprocess.Popen[str], deadline: float) -> None:
    while not path.exists():
        assert proc.poll() is None, "the run ended before its batch started"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_a_forced_stop_names_the_batch_the_next_start_runs_again(
    kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers import tests.e2e.cli_jobs
    topic = kafka.new_topic(f"force-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, [b"a", b"b"])
    waiting, opened = tmp_path / "waiting", tmp_path / "opened"
    config = validate(
        {
            "pipeline": {
                "checkpoint": str(tmp_path / "ck"),
                "trigger": "1 second",
                "progress": "json",
            },
            "source": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic]},
            "codec": {"type": "raw"},
            "processor": {
                "type": "tests.e2e.cli_jobs:GatedCountRaw",
                "options": {"waiting": str(waiting), "opened": str(opened)},
            },
            "sink": {"path": str(tmp_path / "out")},
            "spark": {"master": "local[1]"},
        }
    )
    toml = tmp_path / "p.toml"
    toml.write_text(dump_toml(config))
    err_file = tmp_path / "stderr"
    with err_file.open("w") as stderr:  # a file: the run's children may keep it open
        proc = subprocess.Popen(
            run_command(toml),
            env=spark_child_env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its JVM and workers too: killed at the end regardless
        )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        events = _Events(proc.stdout)
        first = events.next(lambda e: e["event"] == "batch" and e["records"] > 0, deadline)
        _produce(kafka.bootstrap_servers, topic, [b"gate"])  # the next batch holds on it
        _wait_for(waiting, proc, deadline)
        proc.send_signal(signal.SIGINT)
        asked = events.next(lambda e: "received" in e.get("message", ""), deadline)
        assert "stopping after the current batch (again to force)" in asked["message"], asked
        proc.send_signal(signal.SIGINT)
        forced = events.next(lambda e: "forced stop" in e.get("message", ""), deadline)
        proc.wait(timeout=120)
    finally:
        opened.touch()  # the held worker may finish; then nothing of the run is left
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    err = err_file.read_text()
    held = first["batch_id"] + 1
    assert forced["message"] == (
        f"inorder: forced stop: batch {held} did not finish and will be re-run by the next "
        "start (its output is still written once)"
    ), events.seen
    assert proc.returncode == 130, err[-3000:]
    assert err.strip() == "inorder: interrupted", err[-3000:]

    done = run_to_the_end(toml, "--progress", "json", cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    batches = [json.loads(line) for line in done.stdout.splitlines() if '"batch"' in line]
    assert batches[0]["batch_id"] == held and batches[0]["records"] == 1, batches
    assert read_committed(str(tmp_path / "out")).num_rows == 3
