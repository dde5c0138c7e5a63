"""Storage faults: a damaged checkpoint is refused by name, never silently reset.

A pipeline runs once on the shared local SparkSession; then one checkpoint file is truncated
or overwritten with garbage and the next run must stop with one line naming the file and the
way out (``inorder repair``), leaving the output as it was.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from inorder import Integrity, KafkaSource, ParquetSink, Pipeline
from inorder.commands.run import dump_toml
from inorder.errors import InorderError
from inorder.pipeline.config import validate
from inorder.sinks.parquet import read_committed
from tests.e2e.cli_jobs import CountReadings
from tests.faults.test_process_faults import verified
from tests.fixtures.sessions_job import run_command, spark_child_env

ROOT = Path(__file__).resolve().parents[2]


def _produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, key=b"s", value=f'{{"site": "s", "value": {i}}}'.encode())
    producer.flush(30)


def _pipeline(kafka: Any, topic: str, work: Path) -> Pipeline[Any, Any, Any]:
    return Pipeline(
        source=KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topics=[topic]),
        processor=CountReadings(),
        integrity=Integrity.strict(sequence_field="value"),
        sink=ParquetSink(str(work / "out")),
        checkpoint=str(work / "ck"),
        trigger="available-now",
        spark_master="local[2]",
        progress="quiet",
    )


def _run_elsewhere(kafka: Any, topic: str, work: Path) -> str:
    """The same pipeline in a new process with an empty state cache: its last stderr line.

    Worker processes cache state locally; a new process with its own ``TMPDIR`` has none, so
    the state is read back from the checkpoint's files, as on a new executor.
    """
    toml = _pipeline_file(kafka, topic, work)
    (work / "tmp").mkdir()
    # This tree's code first: an installed inorder (an editable install of another
    # checkout) must not answer for it.
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env = {**spark_child_env(), "TMPDIR": str(work / "tmp"), "PYTHONPATH": path}
    done = subprocess.run(
        run_command(toml, "--quiet"),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0, "a damaged state delta was read without error"
    return done.stderr.strip().splitlines()[-1].removeprefix("inorder: error: ")


def _pipeline_file(kafka: Any, topic: str, work: Path) -> Path:
    """The pipeline of :func:`_pipeline` as a pipeline file (``work/p.toml``)."""
    toml = work / "p.toml"
    toml.write_text(
        dump_toml(
            validate(
                {
                    "pipeline": {"checkpoint": str(work / "ck"), "trigger": "available-now"},
                    "source": {"bootstrap_servers": kafka.bootstrap_servers, "topics": [topic]},
                    "codec": {"type": "json"},
                    "processor": {"type": "tests.e2e.cli_jobs:CountReadings"},
                    "integrity": {"sequence_field": "value"},
                    # ParquetSink's own default, as in _pipeline: the layout must not change.
                    "sink": {"path": str(work / "out"), "partition_by": []},
                    "spark": {"master": "local[1]"},
                }
            )
        )
    )
    return toml


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x00garbage\xff" * 8)


def _state_delta(work: Path) -> Path:
    files = sorted(
        p for p in (work / "ck" / "engine").rglob("*") if p.is_file() and p.stat().st_size > 0
    )
    deltas = [p for p in files if "delta" in p.name or p.suffix in (".arrow", ".bin", ".zst")]
    assert deltas, f"no state delta among {[str(p) for p in files]}"
    return deltas[-1]


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
@pytest.mark.parametrize("target", ["info file", "state delta"])
def test_damaged_checkpoint_is_refused_by_name(
    kafka: Any, spark: Any, tmp_path: Path, matrix: Any, target: str, how: str
) -> None:
    topic = kafka.new_topic()
    _produce(kafka.bootstrap_servers, topic, 0, 20)
    assert _pipeline(kafka, topic, tmp_path).run().records == 20
    rows_before = read_committed(str(tmp_path / "out")).num_rows
    damaged = (
        tmp_path / "ck" / "inorder-checkpoint.json"
        if target == "info file"
        else _state_delta(tmp_path)
    )
    _damage(damaged, how)
    _produce(kafka.bootstrap_servers, topic, 20, 10)
    if target == "info file":
        with pytest.raises(InorderError) as refused:
            _pipeline(kafka, topic, tmp_path).run()
        line = str(refused.value)
    else:
        line = _run_elsewhere(kafka, topic, tmp_path)
    # verify needs the checkpoint's info file (whose output it is) but never the state.
    proof_ok, proof = verified(_pipeline_file(kafka, topic, tmp_path))
    proof_as_expected = (
        not proof_ok and damaged.name in proof and "\n" not in proof
        if target == "info file"
        else proof_ok
    )
    ok = "\n" not in line and "inorder repair" in line and damaged.name in line
    if target == "info file" and proof_as_expected:
        # The refusal is the expected outcome: the row says so rather than quoting it twice.
        proof = f"verify stops the same way, with one line naming {damaged.name}"
    matrix.record(
        group="storage",
        fault=f"{target} {how}",
        times=1,
        outcome="named error",
        check=f"{line}; {proof}",
        ok=ok and proof_as_expected,
    )
    assert proof_as_expected, proof
    assert "\n" not in line, line
    assert damaged.name in line and "inorder repair" in line, line
    assert read_committed(str(tmp_path / "out")).num_rows == rows_before  # nothing reset
