"""``inorder replay``: scripted pdb sessions stop where asked, with the checkpointed state."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_validate import RunFixture, make_run

from inorder.assemble import load_target
from inorder.checkpoint.state_files import load_partition_state
from inorder.ops.batchlog import load_batch_log
from inorder.ops.kafka_reads import read_chunks
from inorder.ops.replay import Replayer, ReplayOptions
from inorder.records import TopicPartition
from inorder.state.codec import StateCodec


@pytest.fixture(scope="module")
def faulty_run(kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> RunFixture:
    return make_run(kafka, tmp_path_factory.mktemp("replay"), seed=51, faulty=0.5)


def pdb(*args: str, commands: list[str]) -> subprocess.CompletedProcess[str]:
    """``inorder replay ARGS`` with pdb reading ``commands`` from stdin."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONBREAKPOINT"}
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", "replay", *args],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _values(stdout: str, tag: str) -> list[str]:
    return re.findall(rf"{tag}=(\S+)", stdout)


def test_break_at_offset_stops_with_checkpointed_state(faulty_run: RunFixture) -> None:
    target = load_target(str(faulty_run.toml))
    log = load_batch_log(target.spark_dir, target.engine)
    committed = [b for b in log.batches if b.committed]
    assert len(committed) >= 3, "the run should take several batches"
    final = committed[-1].end
    # A batch in the middle of some partition's history (records follow its end).
    batch, tp = next(
        (b, tp)
        for b in committed[len(committed) // 2 :]
        for tp in sorted(b.end)
        if b.end[tp] < final[tp] - 3
    )
    offset = batch.end[tp]
    record = next(read_chunks(target.source_options, tp, offset, offset + 1))[0]
    session = record[1].decode()
    state = load_partition_state(target.engine, tp, batch.batch_id)
    codec = StateCodec(target.types.state)
    expected_seq = (
        codec.decode(raw).seq
        if (raw := getattr(state.entries.get(session), "state", None))
        else None
    )

    commands = [
        "print('OFFSET=' + str(ctx.offset))",
        "print('KEY=' + str(key))",
        "print('SEQ=' + str(None if state is None else state.seq))",
        "c",
    ]
    common = ["--topic", tp.topic, "--partition", str(tp.partition)]
    done = pdb(
        str(faulty_run.toml),
        *common,
        "--break-at-offset",
        str(offset),
        "--to-offset",
        str(offset + 3),
        commands=commands,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(Pdb)" in done.stdout
    assert _values(done.stdout, "OFFSET") == [str(offset)]
    assert _values(done.stdout, "KEY") == [session]
    assert _values(done.stdout, "SEQ") == [str(expected_seq)]

    # Starting from the checkpointed state of that batch reaches the same state directly.
    done = pdb(
        str(faulty_run.toml),
        *common,
        "--break-at-offset",
        str(offset),
        "--from-offset",
        str(offset),
        "--to-offset",
        str(offset + 3),
        "--from-checkpoint-version",
        str(batch.batch_id),
        commands=commands,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"from state version {batch.batch_id}" in done.stdout
    assert _values(done.stdout, "SEQ") == [str(expected_seq)]


def test_break_on_violation_stops_at_injected_fault(faulty_run: RunFixture) -> None:
    faults = faulty_run.sim.ground_truth.faults()
    assert faults, "the simulation should inject faults"
    first = min(faults, key=lambda f: (f.topic, f.partition, f.offset))
    done = pdb(
        str(faulty_run.toml),
        "--topic",
        first.topic,
        "--partition",
        str(first.partition),
        "--break-on-violation",
        "--to-offset",
        str(first.offset + 2),
        commands=[
            "print('OFFSET=' + str(offset))",
            "print('RULE=' + violation.rule)",
            "c",
            "c",
            "c",
        ],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _values(done.stdout, "OFFSET")[0] == str(first.offset)
    assert "VIOLATION" in done.stdout


def _replay_window(target: Any, tp: TopicPartition) -> tuple[Any, str, list[int]]:
    """Replay offsets 5..12 of ``tp`` with a break at offset 8: summary, text, stops."""
    lines: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    stops: list[int] = []
    replayer = Replayer(
        target,
        ReplayOptions(
            tp.topic, tp.partition, from_offset=5, to_offset=12, break_when="offset == 8"
        ),
        out=Sink(),  # type: ignore[arg-type]
    )
    replayer.debug = lambda msg, state, ctx, key, offset, *rest: stops.append(offset)
    summary = replayer.run()
    return summary, "".join(lines), stops


def test_replay_prints_records_and_state_changes(faulty_run: RunFixture) -> None:
    target = load_target(str(faulty_run.toml))
    # Which sessions land in which partition follows the topics' random prefix, and a window
    # may hold only records of sessions the policy ignores after a fault (no state change to
    # show): the window is taken in the first partition whose records change state.
    log = load_batch_log(target.spark_dir, target.engine)
    ends = [b for b in log.batches if b.committed][-1].end
    shown = None
    for tp in sorted(tp for tp, end in ends.items() if end > 13):
        summary, text, stops = _replay_window(target, tp)
        if " row(s): " in text:
            shown = text
            break
    assert shown is not None, "no window of offsets 5..12 applied a record"
    assert summary.printed == 8
    assert stops == [8]
    assert re.search(r"^\s+5 .*key '", shown, re.M)
    # Every record that produced rows shows the state change it made, right after them.
    blocks = re.split(r"(?m)^\s+\d+ \S+ key ", shown)[1:]
    applied = [b for b in blocks if " row(s): " in b]
    assert applied and all("\n      state " in b for b in applied), shown
    assert Path(faulty_run.toml).exists()
