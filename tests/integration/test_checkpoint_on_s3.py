"""The ops tools on a checkpoint on S3 read what they read on local disk.

Spark writes its own checkpoint through Hadoop's filesystem, and its S3 connector is not
shipped (docs/operations-guide.md), so the pipeline runs on a local checkpoint that is then
copied, object for object, to the S3 server. ``inspect``, ``validate``, ``replay`` and
``repair`` read (and repair rewrites) that copy through :mod:`inorder.checkpoint`, and must
report what they report on the local original.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from tests.fixtures.sessions_job import RESTART_SESSION, sessions_config, small_simulation

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.ops.batchlog import load_batch_log
from inorder.ops.inspect import inspect_all
from inorder.ops.repair import apply_repair, plan_repair
from inorder.ops.replay import Replayer, ReplayOptions
from inorder.ops.target import OpsTarget
from inorder.ops.validate import validate
from inorder.pipeline.runner import PipelineRunner
from inorder.records import TopicPartition


def _batches(doc: dict[str, Any]) -> list[tuple[int, bool, dict[str, list[int]]]]:
    """What a batch is, without the times (S3 objects carry the time of the copy)."""
    return [(b["batch_id"], b["committed"], b["ranges"]) for b in doc["batches"]]


def _state(doc: dict[str, Any]) -> list[tuple[str, int, int | None, int, int]]:
    return [
        (s["topic"], s["partition"], s["version"], s["keys"], s["state_bytes"])
        for s in doc["state"]
    ]


def _replay(target: OpsTarget, tp: TopicPartition, to_offset: int) -> tuple[int | None, str]:
    out = io.StringIO()
    options = ReplayOptions(tp.topic, tp.partition, to_offset=to_offset, from_version=0)
    summary = Replayer(target, options, out=out).run()
    return summary.started_from_version, out.getvalue()


def test_inspect_validate_replay_and_repair_on_an_s3_checkpoint(
    kafka: Any, spark: Any, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"ck-s3-{random.randrange(10**9)}-"
    simulate(
        small_simulation(prefix, 5, 0.0, messages=600, restart_every=90), kafka.bootstrap_servers
    )
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        name="ck-s3",
        max_offsets=200,
        integrity=RESTART_SESSION,
        sink={"path": str(tmp_path / "output"), "partition_by": ["topic"]},
    )
    local_toml = tmp_path / "local.toml"
    local_toml.write_text(dump_toml(config))
    PipelineRunner(build_pipeline(config), stop_after_batches=2).run()

    # The same checkpoint on S3: the tools find it (and its engine state) by the environment.
    for name, value in s3.storage_options().items():
        monkeypatch.setenv(name, value)
    remote = s3.new_prefix() + "/checkpoint"
    pafs.copy_files(
        str(tmp_path / "checkpoint"),
        remote.removeprefix("s3://"),
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=s3.pyarrow_fs(),
    )
    s3_config = {**config, "pipeline": {**config["pipeline"], "checkpoint": remote}}
    s3_toml = tmp_path / "s3.toml"
    s3_toml.write_text(dump_toml(s3_config))
    local, on_s3 = load_target(str(local_toml)), load_target(str(s3_toml))
    assert on_s3.layout.location.is_s3

    # inspect: the same batches (ranges, committed) and the same state per partition.
    want = inspect_all(local, True, True, limit=None)
    got = inspect_all(on_s3, True, True, limit=None)
    assert got["checkpoint"] == remote
    assert got["last_committed_batch"] == want["last_committed_batch"] == 1
    assert _batches(got) == _batches(want) and len(got["batches"]) >= 2
    assert _state(got) == _state(want) and sum(s[3] for s in _state(got)) > 0

    # validate: every partition recomputed from Kafka equals the output, as on disk.
    checked, expected = validate(on_s3), validate(local)
    assert checked.ok, checked.lines()
    assert [(p.topic, p.partition, p.records, p.actual_rows) for p in checked.partitions] == [
        (p.topic, p.partition, p.records, p.actual_rows) for p in expected.partitions
    ]
    assert sum(p.actual_rows for p in checked.partitions) > 0

    # replay: starts from the state checkpointed on S3 and prints what it prints locally.
    first, second = load_batch_log(local.layout).batches[:2]
    tp, end = next((tp, e) for tp, e in sorted(second.end.items()) if e > first.end.get(tp, e))
    version, printed = _replay(on_s3, tp, end - 1)
    assert version == 0 and (version, printed) == _replay(local, tp, end - 1)
    assert printed.strip()

    # repair: the plan read from S3 is the local one; applying it swaps the S3 checkpoint.
    plan = plan_repair(on_s3)
    local_plan = plan_repair(local)
    assert plan.checkpoint == remote and not plan.nothing_to_do
    assert plan.starting_offsets() == local_plan.starting_offsets()
    assert plan.batch_offset == local_plan.batch_offset == 2
    owner = on_s3.layout.info()
    assert owner is not None and owner.id is not None
    applied = apply_repair(on_s3, plan)
    assert applied.applied and applied.backup is not None
    backup = CheckpointLayout(applied.backup)
    assert backup.planned_batches() == local.layout.planned_batches()
    info = on_s3.layout.info()
    assert info is not None and info.id == owner.id and info.identity == owner.identity
    assert info.batch_offset == 2 and info.starting_offsets == plan.starting_offsets()
    assert on_s3.layout.planned_batches() == []
    assert plan_repair(load_target(str(s3_toml))).nothing_to_do
