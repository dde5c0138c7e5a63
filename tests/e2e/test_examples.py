"""Every example runs as documented, against the real broker and Spark."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer

from inorder.dev.sim_model import SimulationConfig
from inorder.dev.simulator import simulate
from inorder.dev.verify import verify_tables
from inorder.sessions.rebuild import read_changes, rebuild_tables

ROOT = Path(__file__).resolve().parents[2]


def run_cli(
    args: list[str], env: dict[str, str], cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def sessions_topics(kafka: Any) -> tuple[str, Any]:
    prefix = f"ex-{random.randrange(10**9)}-site-"
    config = SimulationConfig(
        sites=2,
        topic_prefix=prefix,
        partitions=2,
        sessions_per_site=6,
        rows_per_snapshot=5,
        messages=2000,
        restart_every=100,
        seed=5,
    )
    return prefix, simulate(config, kafka.bootstrap_servers).ground_truth


def test_sessions_toml_example(
    kafka: Any, sessions_topics: tuple[str, Any], tmp_path: Path
) -> None:
    prefix, truth = sessions_topics
    done = run_cli(
        [
            "run",
            str(ROOT / "examples" / "sessions.toml"),
            "--progress",
            "json",
            "--set",
            f"source.topic_pattern={prefix}.*",
            "--set",
            f"sink.path={tmp_path / 'out'}",
            "--set",
            f"pipeline.checkpoint={tmp_path / 'ckpt'}",
        ],
        {"INORDER_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summary = [e for e in events if e["event"] == "summary"][-1]
    assert summary["records"] == truth.records
    changes = read_changes(str(tmp_path / "out"))
    assert verify_tables(rebuild_tables(changes), truth, changes).ok


def test_sessions_python_example(
    kafka: Any, sessions_topics: tuple[str, Any], tmp_path: Path
) -> None:
    prefix, truth = sessions_topics
    done = run_cli(
        ["run", "examples.sessions:pipeline", "--quiet"],
        {
            "INORDER_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "INORDER_EXAMPLE_TOPICS": f"{prefix}.*",
            "INORDER_EXAMPLE_OUTPUT": str(tmp_path / "out"),
            "INORDER_EXAMPLE_CHECKPOINT": str(tmp_path / "ckpt"),
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    changes = read_changes(str(tmp_path / "out"))
    assert verify_tables(rebuild_tables(changes), truth, changes).ok


def test_typed_processor_example(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(f"ex-{random.randrange(10**9)}-readings", partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    values = {"s1": [1.0, 2.0, 6.0], "s2": [10.0, 20.0]}
    for site, readings in values.items():
        for value in readings:
            producer.produce(topic, key=site, value=json.dumps({"site": site, "value": value}))
    producer.flush()
    done = run_cli(
        ["run", "examples.typed_processor:pipeline", "--trigger", "available-now", "--quiet"],
        {
            "INORDER_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "INORDER_EXAMPLE_TOPICS": topic,
            "INORDER_EXAMPLE_OUTPUT": str(tmp_path / "out"),
            "INORDER_EXAMPLE_CHECKPOINT": str(tmp_path / "ckpt"),
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = read_changes(str(tmp_path / "out"))
    last = {}
    for row in table.sort_by([("site", "ascending"), ("count", "ascending")]).to_pylist():
        last[row["site"]] = (row["count"], row["mean"])
    assert last == {"s1": (3, 3.0), "s2": (2, 15.0)}
    assert pc.min(table.column("offset")).as_py() == 0


def test_typed_processor_example_prints_its_schema() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "typed_processor.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "mean: double" in done.stdout


def test_fuzzy_windows_example(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(f"ex-{random.randrange(10**9)}-readings", partitions=1)
    t0 = 1_731_000_000 - 1_731_000_000 % 60
    rng = random.Random(3)
    sent: list[tuple[str, float, float]] = []
    for i in range(60):  # 5 minutes of readings per site, locally out of order (< 10 s)
        for site in ("s1", "s2"):
            sent.append((site, float(i), t0 + i * 5 + rng.uniform(-8, 8)))
    sent.append(("s1", 99.0, t0 + 10))  # far behind the watermark by then: late
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for site, value, ts in sent:
        producer.produce(
            topic, key=site, value=json.dumps({"site": site, "value": value, "ts": ts})
        )
    producer.flush()
    # The batch computation: lateness as the tier defines it, closed minutes only.
    newest, late, kept = float("-inf"), [], []
    for reading in sent:
        if reading[2] < newest - 30:
            late.append(reading)
        else:
            kept.append(reading)
        newest = max(newest, reading[2])
    watermark = newest - 30
    expected: dict[tuple[str, int], list[float]] = {}
    for site, value, ts in kept:
        start = int(ts // 60) * 60
        if start + 60 <= watermark:
            expected.setdefault((site, start), []).append(value)
    done = run_cli(
        [
            "run",
            str(ROOT / "examples" / "fuzzy_windows.toml"),
            "--quiet",
            "--set",
            f"source.topic_pattern={topic}",
            "--set",
            f"sink.path={tmp_path / 'out'}",
            "--set",
            f"dead_letter.path={tmp_path / 'late'}",
            "--set",
            f"pipeline.checkpoint={tmp_path / 'ckpt'}",
        ],
        {"INORDER_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers},
    )
    # The late reading was set aside (dead-lettered): a run that did exits 3, not 0.
    assert done.returncode == 3, done.stderr[-3000:]
    rows = read_changes(str(tmp_path / "out")).to_pylist()
    got = {(r["site"], int(r["window_start"].timestamp())): (r["count"], r["mean"]) for r in rows}
    assert got == {k: (len(v), pytest.approx(sum(v) / len(v))) for k, v in expected.items()}
    assert len(late) == 1
    assert read_changes(str(tmp_path / "late")).num_rows == len(late)
