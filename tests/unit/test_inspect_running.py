"""`inspect` tells the batch a live run is applying ("in flight") from one no run finished."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.names import LEASE_FILE
from inorder.ops.inspect import format_inspect, running_run


def _batch(batch_id: int, committed: bool) -> dict[str, Any]:
    return {
        "batch_id": batch_id, "committed": committed, "duration_seconds": None,
        "planned_at": "2026-11-26T10:00:00+00:00", "records_planned": 10,
        "ranges": {"t[0]": [0, 10]}, "restarted": False,
    }  # fmt: skip


def _states(running: str | None) -> list[str]:
    doc = {
        "checkpoint": "ck", "last_committed_batch": 1, "running": running,
        "batches": [_batch(1, True), _batch(2, False)],
    }  # fmt: skip
    return [line.split()[2] + " " + line.split()[3] for line in format_inspect(doc)[1:]
            if line.startswith("batch")]  # fmt: skip


def test_the_newest_batch_of_a_live_run_is_in_flight() -> None:
    assert _states(None) == ["committed planned", "NOT committed"]
    assert _states("pid 7 on h, lease epoch 1 valid until 10:00:30") == [
        "committed planned",
        "in flight",
    ]


def test_a_held_lease_is_a_run_a_dead_holders_or_released_one_is_not(tmp_path: Path) -> None:
    layout = CheckpointLayout(str(tmp_path))
    assert running_run(layout) is None  # never run
    lease = layout.lease(30.0)
    lease.acquire()
    assert running_run(layout) is not None and "lease epoch 1" in str(running_run(layout))
    lease.release()
    assert running_run(layout) is None
    # A run killed on this host leaves its lease unexpired: its pid, gone, tells.
    record = json.loads((tmp_path / LEASE_FILE).read_text())
    record.update(holder=f"pid 999999999 on {socket.gethostname()}", expires_at=4e9)
    (tmp_path / LEASE_FILE).write_text(json.dumps(record))
    assert running_run(layout) is None
