"""``inorder inspect``: batches cover the topics exactly; a key's state equals the ground truth."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.integration.test_validate import RunFixture, cli, make_run

from inorder.assemble import load_target
from inorder.ops.batchlog import load_batch_log
from inorder.ops.inspect import inspect_all, key_state
from inorder.records import TopicPartition


@pytest.fixture(scope="module")
def clean_run(kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> RunFixture:
    return make_run(kafka, tmp_path_factory.mktemp("inspect"), seed=61)


def test_batches_cover_every_record_once(clean_run: RunFixture) -> None:
    doc = inspect_all(load_target(str(clean_run.toml)), True, True, limit=None)
    batches = doc["batches"]
    assert len(batches) >= 3
    assert all(b["committed"] for b in batches)
    assert doc["last_committed_batch"] == batches[-1]["batch_id"]
    # Ranges chain: each batch starts where the previous one ended.
    # Batch 0's start is known too (the source records where each partition began).
    ends: dict[str, int] = {}
    for b in batches:
        for tp, (start, end) in b["ranges"].items():
            assert start == ends.get(tp, 0)
            assert end >= start
            ends[tp] = end
    assert sum(b["records_planned"] for b in batches) == sum(ends.values())
    assert batches[0]["records_planned"] > 0
    truth = clean_run.sim.ground_truth.topics
    expected = {f"{t}[{p}]": o for t, tt in truth.items() for p, o in tt.end_offsets.items()}
    assert ends == expected
    assert all(b["duration_seconds"] is not None for b in batches)
    # State sizes: one entry per partition, keys = sessions still open there. Sessions go to
    # partitions by the hash of their key, which holds the random topic prefix: now and then
    # every session of a site lands in one partition and the other holds none.
    sessions = clean_run.sim.ground_truth.sessions.values()
    for s in doc["state"]:
        here = [x for x in sessions if (x.topic, x.partition) == (s["topic"], s["partition"])]
        assert s["keys"] <= len(here)
        if any(not x.ended for x in here):
            assert s["keys"] > 0 and s["state_bytes"] > 0
        # A partition that never held a key may have only empty slices of the task files,
        # whose bytes are shared by rows: 0 of them are its (seen with the prefix 991136516).
        if here:
            assert s["file_bytes"] > 0, s

    done = cli("inspect", str(clean_run.toml), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["last_committed_batch"] == doc["last_committed_batch"]


def test_key_state_matches_ground_truth(clean_run: RunFixture) -> None:
    target = load_target(str(clean_run.toml))
    log = load_batch_log(target.spark_dir, target.engine)
    truth = next(
        s
        for s in clean_run.sim.ground_truth.sessions.values()
        if s.table_exact and not s.ended and s.table
    )
    tp = TopicPartition(truth.topic, truth.partition)
    doc = key_state(target, tp, truth.session, None, log)
    assert doc["exists"]
    rows = {rid: json.loads(text) for rid, text in doc["state"]["rows"].items()}
    assert rows == truth.table
    assert doc["state"]["seq"] == truth.last_seq

    # An older version is read as of that batch (the first batch already carries data, and
    # a session restarted by a new snapshot may have had a higher seq then).
    first = key_state(target, tp, truth.session, log.batches[0].batch_id, log)
    if first["exists"]:
        assert first["last_offset"] < log.batches[0].end[tp]
        assert first["last_offset"] <= doc["last_offset"]

    done = cli(
        "inspect",
        str(clean_run.toml),
        "--key",
        truth.session,
        "--topic",
        tp.topic,
        "--partition",
        str(tp.partition),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"]["seq"] == truth.last_seq


def test_inspect_into_a_closed_pipe_is_quiet(clean_run: RunFixture) -> None:
    """`inorder inspect ... | head`: the reader is gone before the output is written."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "inorder.cli", "inspect", str(clean_run.toml)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # closed before the command prints anything: EPIPE is certain
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_every_run_records_its_batch_history(clean_run: RunFixture) -> None:
    """A run from Python (no CLI, no status page) keeps each batch's progress line too."""
    from inorder.pipeline.batch_history import read_history

    target = load_target(str(clean_run.toml))
    log = load_batch_log(target.spark_dir, target.engine)
    history = read_history(target.layout)
    assert sorted(history) == [b.batch_id for b in log.batches]
    assert sum(h["records"] for h in history.values()) == clean_run.sim.records
