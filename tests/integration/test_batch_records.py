"""The engine's per-batch processing-time records stay bounded in number (merged files)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from inorder.assemble import build_pipeline, load_target
from inorder.dev.sim_model import FaultRates, SimulationConfig
from inorder.dev.simulator import simulate
from inorder.ops.validate import validate
from inorder.pipeline.config import validate as validate_config
from inorder.sinks.parquet import read_committed
from inorder.state import checkpoint as ck
from inorder.state.checkpoint import CheckpointStore
from inorder.storage import fs as sfs


def batch_files(store: CheckpointStore) -> list[str]:
    return sorted(i.base_name for i in sfs.list_files(store.location, store.path("batches")))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_batch_records_are_merged_and_every_time_is_kept(
    where: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ck, "BATCH_RECORDS_MERGE", 5)
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        store = CheckpointStore(s3.new_prefix() + "/engine", s3.storage_options())
    else:
        store = CheckpointStore(str(tmp_path / "engine"))
    recorded: dict[int, int] = {}
    most = 0
    for batch_id in range(42):
        recorded[batch_id] = store.batch_time_us(batch_id)
        most = max(most, len(batch_files(store)))
    # At most 3 intervals of single records plus one merged file, however many batches ran.
    assert most <= 3 * 5 + 1, batch_files(store)
    names = batch_files(store)
    assert f"upto-{35:020d}.parquet" in names and f"{0:020d}.json" not in names, names
    assert store.batch_times() == recorded
    assert store.batch_times([3, 40, 99]) == {3: recorded[3], 40: recorded[40]}
    # A re-run of an old batch (its single record merged away) gets the same time.
    assert store.batch_time_us(3) == recorded[3]
    assert store.batch_time_us(40) == recorded[40]
    # A crash between writing a merged file and deleting what it covers leaves both:
    # readers take either (same values), the next merge deletes the leftovers.
    store.write_json(
        {"batch_id": 7, "processing_time_us": recorded[7]}, "batches", f"{7:020d}.json"
    )
    assert store.batch_times() == recorded
    store.merge_batch_times(38)
    assert f"{7:020d}.json" not in batch_files(store)
    assert store.batch_times() == recorded


@pytest.fixture
def merge_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Merge batch records after every batch (the driver records them in this process)."""
    monkeypatch.setattr(ck, "BATCH_RECORDS_MERGE", 1)


@pytest.mark.slow
def test_validate_reproduces_timeouts_from_merged_batch_records(
    kafka: Any, spark: Any, tmp_path: Path, merge_every_batch: None
) -> None:
    prefix = f"brec-{random.randrange(10**9)}-"
    simulate(
        SimulationConfig(
            sites=1,
            topic_prefix=prefix,
            partitions=2,
            sessions_per_site=6,
            rows_per_snapshot=5,
            messages=900,
            restart_every=80,
            end_probability=0.05,  # ended sessions get no more messages: they time out
            faults=FaultRates(),
            faulty_sessions=0.0,
            seed=17,
        ),
        kafka.bootstrap_servers,
    )
    config = validate_config(
        {
            "pipeline": {
                "name": "brec",
                "checkpoint": str(tmp_path / "checkpoint"),
                "trigger": "available-now",
                "progress": "quiet",
            },
            "source": {
                "bootstrap_servers": kafka.bootstrap_servers,
                "topic_pattern": f"{prefix}.*",
                "max_offsets_per_trigger": 150,
            },
            # Processing-time timeouts: which sessions end depends on when batches ran.
            "processor": {"type": "sessions", "options": {"inactivity_timeout": "1 milliseconds"}},
            "sink": {"path": str(tmp_path / "output"), "partition_by": ["topic"]},
            "spark": {"master": "local[2]"},
        }
    )
    build_pipeline(config).run()
    from inorder.commands.run import dump_toml

    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    engine = CheckpointStore(str(tmp_path / "checkpoint" / "engine"))
    names = batch_files(engine)
    merged = [n for n in names if n.startswith("upto-")]
    assert len(merged) == 1 and len(names) <= 3, names
    output = read_committed(str(tmp_path / "output"))
    ends = pc.sum(pc.equal(output.column("op"), "end")).as_py()
    assert ends and ends > 0, "no session ended by a processing-time timeout"
    report = validate(load_target(str(toml)))
    assert report.ok, "\n".join(report.lines())
    assert all(p.exact_batches for p in report.partitions)
