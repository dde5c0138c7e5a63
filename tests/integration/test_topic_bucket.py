"""``partition_by = ["topic_bucket"]`` on a real run of many topics (the local broker, Spark).

Forty topics of one partition in four buckets, three batches, the compactor thread merging
by pairs: every row is in the output exactly once with its bucket, each batch wrote files
per bucket (not per topic), rows are sorted by topic inside each file, ``verify`` and
``validate`` are clean over the merged files, and another bucket count or layout on the
same output is refused by name.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.fixtures.sessions_job import TWO_LOCAL_CORES, duplicate_change_rows, sessions_config

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint.layout import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.dev.sim_config import SimulationConfig
from inorder.dev.sim_model import FaultRates
from inorder.dev.simulator import simulate
from inorder.ops.validate import validate
from inorder.ops.verify import verify
from inorder.schema import output_schema
from inorder.sinks.parquet import ParquetSink, committed_files, read_committed
from inorder.sinks.topic_bucket import TOPIC_BUCKET, OutputLayoutChanged, topic_bucket

TOPICS = 40
BUCKETS = 4


@dataclass
class Bucketed:
    toml: Path
    output: Path
    owner: str
    topics: list[str]
    config: dict[str, Any]


@pytest.fixture(scope="module")
def bucketed(kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Bucketed:
    work = tmp_path_factory.mktemp("topic-bucket")
    prefix = f"tb{random.randrange(10**9)}-"
    sim = simulate(
        SimulationConfig(
            sites=TOPICS, topic_prefix=prefix, partitions=1, sessions_per_site=2,
            rows_per_snapshot=3, messages=TOPICS * 9, seed=11, faults=FaultRates(),
            faulty_sessions=0.0,
        ),
        kafka.bootstrap_servers,
    )  # fmt: skip
    sink = {
        "path": str(work / "output"),
        "partition_by": [TOPIC_BUCKET],
        "topic_buckets": BUCKETS,
        "compact": True,
        "compaction_fanout": 2,
    }
    config = sessions_config(
        kafka.bootstrap_servers, prefix, work, name="bucketed", max_offsets=TOPICS * 3,
        spark=TWO_LOCAL_CORES, sink=sink,
    )  # fmt: skip
    build_pipeline(config).run()
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(config))
    info = CheckpointLayout.of(str(work / "checkpoint")).read_info() or {}
    topics = sorted(sim.ground_truth.topics)
    assert len(topics) == TOPICS
    return Bucketed(toml, work / "output", str(info["id"]), topics, config)


def manifests(output: Path) -> list[dict[str, Any]]:
    commits = output / "_inorder" / "commits"
    return [
        json.loads(p.read_text())
        for p in sorted(commits.glob("*.json"))
        if not p.name.endswith(".checkpoint.json")
    ]


def test_every_row_once_in_its_topics_bucket(bucketed: Bucketed) -> None:
    rows = read_committed(str(bucketed.output))
    assert rows.schema.field(TOPIC_BUCKET).type == "int32"
    assert duplicate_change_rows(rows) == 0
    assert sorted(pc.unique(rows.column("topic")).to_pylist()) == bucketed.topics
    for topic, bucket in zip(
        rows.column("topic").to_pylist(), rows.column(TOPIC_BUCKET).to_pylist(), strict=True
    ):
        assert bucket == topic_bucket(topic, BUCKETS)
    # Directories are the buckets; nothing is laid out by topic.
    dirs = {p.name for p in bucketed.output.iterdir() if not p.name.startswith("_")}
    assert dirs == {f"{TOPIC_BUCKET}={b}" for b in range(BUCKETS)}


def test_each_batch_writes_files_per_bucket_not_per_topic(bucketed: Bucketed) -> None:
    batches = manifests(bucketed.output)
    assert len(batches) >= 3
    for m in batches:
        files = m["files"]
        buckets = {f["partition_values"][TOPIC_BUCKET] for f in files}
        assert buckets <= {str(b) for b in range(BUCKETS)}
        # One file per bucket per task (local[2]: at most two tasks write a bucket).
        assert len(buckets) <= len(files) <= 2 * len(buckets) < TOPICS
        assert m["partition_by"] == [TOPIC_BUCKET]


def test_rows_are_sorted_by_topic_inside_each_row_group(bucketed: Bucketed) -> None:
    live = committed_files(str(bucketed.output))
    assert any(f.level > 0 for f in live), "the compactor merged nothing"
    for f in live:
        parquet = pq.ParquetFile(bucketed.output / f.path)
        for i in range(parquet.num_row_groups):
            group = parquet.read_row_group(i, columns=["topic", "partition", "offset"])
            keys = list(zip(*(c.to_pylist() for c in group.columns), strict=True))
            assert keys == sorted(keys), f.path
        if f.level == 0:  # a batch file: sorted throughout
            whole = parquet.read(["topic", "offset"])
            keys = list(zip(*(c.to_pylist() for c in whole.columns), strict=True))
            assert keys == sorted(keys), f.path


def test_verify_and_validate_are_clean(bucketed: Bucketed) -> None:
    sink = ParquetSink(str(bucketed.output), partition_by=[TOPIC_BUCKET], topic_buckets=BUCKETS)
    report = verify(sink, bucketed.owner, digests=True)
    assert report.ok, "\n".join(report.lines())
    assert report.digests_checked == report.files > 0
    checked = validate(load_target(str(bucketed.toml)))
    assert checked.ok, "\n".join(checked.lines())


def test_another_bucket_count_or_layout_is_refused(bucketed: Bucketed) -> None:
    from inorder.processor import processor_types

    schema = output_schema(processor_types(build_pipeline(bucketed.config).processor).out)
    same = ParquetSink(str(bucketed.output), partition_by=[TOPIC_BUCKET], topic_buckets=BUCKETS)
    same.check(schema)
    other = ParquetSink(str(bucketed.output), partition_by=[TOPIC_BUCKET], topic_buckets=8)
    with pytest.raises(OutputLayoutChanged, match=r"in 4 topic buckets, .* is 8"):
        other.check(schema)
    with pytest.raises(OutputLayoutChanged, match=r"partitioned by \['topic_bucket'\]"):
        ParquetSink(str(bucketed.output), partition_by=["topic"]).check(schema)
