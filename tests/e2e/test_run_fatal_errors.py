"""Fatal errors during a run end in one line naming the cause, where, and what addresses it.

Reproduced before the fix: data loss below the log start printed ~40 lines of JVM trace ending
in a Python traceback and hinted at ``failOnDataLoss=false`` instead of the TOML key; a second
copy of a pipeline on the same checkpoint died with Spark's ``CONCURRENT_STREAM_LOG_UPDATE``
trace.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import TopicPartition as KafkaTopicPartition

from inorder.commands.run import dump_toml
from inorder.pipeline.config import validate

ROOT = Path(__file__).resolve().parents[2]


def _produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, key=f"k{i % 7}", value=f'{{"value": {i}}}'.encode())
    producer.flush(30)


def _pipeline(tmp_path: Path, bootstrap: str, topic: str, **source: Any) -> Path:
    config = validate(
        {
            "pipeline": {
                "checkpoint": str(tmp_path / "ck"),
                "trigger": "available-now",
                "progress": "plain",
            },
            "source": {"bootstrap_servers": bootstrap, "topics": [topic], **source},
            "codec": {"type": "raw"},
            "processor": {"type": "tests.e2e.cli_jobs:CountRaw"},
            "sink": {"path": str(tmp_path / "out")},
            "spark": {"master": "local[1]"},
        }
    )
    path = tmp_path / "p.toml"
    path.write_text(dump_toml(config))
    return path


def _run(path: Path, *extra: str, wait: bool = True) -> Any:
    command = [sys.executable, "-m", "inorder.cli", "run", str(path), *extra]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    if not wait:
        return subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _assert_one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    assert "\tat " not in stderr and "org.apache.spark" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("inorder: error:")]
    assert len(errors) == 1, stderr
    assert stderr.strip().splitlines()[-1] == errors[0], stderr
    return errors[0]


def test_data_loss_is_one_line_with_the_toml_key(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(f"loss-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, 0, 100)
    path = _pipeline(tmp_path, kafka.bootstrap_servers, topic)
    first = _run(path)
    assert first.returncode == 0, first.stderr
    _produce(kafka.bootstrap_servers, topic, 100, 100)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.delete_records([KafkaTopicPartition(topic, 0, 150)]).values():
        future.result(timeout=15)

    lost = _run(path)
    assert lost.returncode == 1, lost.stderr
    line = _assert_one_line_error(lost.stderr)
    assert f"topic {topic!r} partition 0" in line and "100" in line and "150" in line, line
    assert "source.fail_on_data_loss = false" in line and "inorder-run.log" in line, line
    log = tmp_path / "ck" / "inorder-run.log"
    assert log.exists() and "DataLossError" in log.read_text(), "the full trace goes to the log"


def test_second_copy_on_one_checkpoint_is_one_line(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(f"copies-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, 0, 50)
    path = _pipeline(tmp_path, kafka.bootstrap_servers, topic)
    stream = ["--trigger", "1 second"]
    first = _run(path, *stream, wait=False)
    try:
        deadline = time.monotonic() + 120
        offsets = tmp_path / "ck" / "spark" / "offsets"
        while not (offsets.exists() and any(offsets.iterdir())):
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline, "the first copy never started a batch"
            time.sleep(0.5)
        second = _run(path, *stream)
    finally:
        first.terminate()
        first.communicate(timeout=120)
    assert second.returncode != 0
    line = _assert_one_line_error(second.stderr)
    assert "another" in line and "checkpoint" in line, line
