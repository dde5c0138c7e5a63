"""`inorder run --ui`: the status page is served beside a running pipeline, live, then stops."""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.fixtures.sessions_job import (
    TWO_LOCAL_CORES,
    run_command,
    sessions_config,
    spark_child_env,
    two_partition_simulation,
)

from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate

URL = re.compile(r"inorder ui: status page at (http://127\.0\.0\.1:\d+)(/pipelines/\S+)")


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        doc: dict[str, Any] = json.loads(response.read())
        return doc


def test_run_serves_the_live_page_until_it_stops(kafka: Any, tmp_path: Path) -> None:
    prefix = f"runui-{random.randrange(10**9)}-"
    simulation = two_partition_simulation(
        prefix, 5, sessions_per_site=4, rows_per_snapshot=5, messages=2000, restart_every=100
    )
    simulate(simulation, kafka.bootstrap_servers)
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        max_offsets=400,
        trigger="1 second",
        progress="json",
        sink={"path": str(tmp_path / "out")},
        spark=TWO_LOCAL_CORES,
    )
    toml = tmp_path / "p.toml"
    toml.write_text(dump_toml(config))
    err_lines: list[str] = []
    proc = subprocess.Popen(
        [*run_command(toml), "--ui", "--ui-port", "0"],
        env=spark_child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        # The URL goes to stderr at start; progress lines (one per batch) to stdout.
        found: list[str] = []

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                err_lines.append(line)
                match = URL.search(line)
                if match and not found:
                    found.append(match.group(1) + match.group(2))

        threading.Thread(target=read_stderr, daemon=True).start()
        deadline = time.monotonic() + 300
        committed = -1
        for line in proc.stdout:  # the first batches with data
            if '"event": "batch"' in line and json.loads(line)["records"] > 0:
                committed = json.loads(line)["batch_id"]
                if committed >= 1:
                    break
            assert time.monotonic() < deadline, "no batches with data"
        assert found, "".join(err_lines)[-3000:]
        page = found[0]
        assert page.startswith("http://127.0.0.1:")  # loopback by default
        # The page's JSON shows the running pipeline's committed batches, live.
        status = _get_json(page + "/status.json")
        assert status["running"] is True
        assert status["last_committed_batch"] >= committed
        assert {p["topic"] for p in status["partitions"]} <= set(simulation.initial_topics())
        assert status["output"]["location"].endswith("out")
        with urllib.request.urlopen(page, timeout=10) as response:
            assert response.status == 200
            assert prefix.encode() in response.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None
        proc.stdout.read()  # the rest of the progress lines (stderr is read by the thread)
        proc.wait(timeout=180)
    assert proc.returncode == 0, "".join(err_lines)[-3000:]
    # The page stops with the run: its port is closed.
    port = int(page.split(":")[2].split("/")[0])
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
