"""Fault matrix, a planned range that reaches no task: the batch commits nothing, names it.

A micro-batch commits only when its task results cover every range the source planned.

The check runs on every batch of every pipeline whose tasks read Kafka themselves; here the
plan the driver reads from Spark's offsets log is given one range more than the tasks were
handed (the stand-in for a range lost on its way to a task): the batch must fail before
anything of it is committed, and a re-run must then complete it exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from inorder.assemble import build_pipeline
from inorder.dev.sim_model import FaultRates, SimulationConfig
from inorder.dev.simulator import simulate
from inorder.engine import plan_coverage
from inorder.records import TopicPartition
from inorder.sinks.parquet import read_committed
from tests.faults.conftest import MatrixRecorder
from tests.fixtures.sessions_job import TWO_LOCAL_CORES, sessions_config


def test_a_batch_whose_results_miss_a_planned_range_commits_nothing(
    kafka: Any,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    matrix: MatrixRecorder,
) -> None:
    prefix = f"cover-{random.randrange(10**9)}-"
    truth = simulate(
        SimulationConfig(
            sites=1, topic_prefix=prefix, partitions=2, sessions_per_site=4,
            rows_per_snapshot=5, messages=600, faults=FaultRates(), faulty_sessions=0.0, seed=5,
        ),
        kafka.bootstrap_servers,
    ).ground_truth  # fmt: skip
    config = sessions_config(
        kafka.bootstrap_servers, prefix, tmp_path, name="cover", max_offsets=200,
        spark=TWO_LOCAL_CORES,
    )  # fmt: skip
    real = plan_coverage.planned_ranges
    seen: dict[int, dict[TopicPartition, tuple[int, int]]] = {}

    def one_more(
        read: Callable[[int], Mapping[str, Any] | None], batch_id: int
    ) -> dict[TopicPartition, tuple[int, int]] | None:
        planned = real(read, batch_id)
        assert planned is not None, f"batch {batch_id}: no plan in Spark's offsets log"
        seen[batch_id] = dict(planned)
        if batch_id == 1:
            planned[TopicPartition(f"{prefix}000", 9)] = (0, 5)
        return planned

    monkeypatch.setattr(plan_coverage, "planned_ranges", one_more)
    with pytest.raises(plan_coverage.PlanNotCovered) as raised:
        build_pipeline(config).run()
    message = str(raised.value)
    # Batch 0's plan was read and covered: the two partitions, 200 offsets between them.
    assert sum(end - start for start, end in seen[0].values()) == 200
    assert {tp.partition for tp in seen[0]} == {0, 1}
    committed = read_committed(str(tmp_path / "output"))
    assert set(pc.unique(committed.column("batch_id")).to_pylist()) == {0}

    monkeypatch.setattr(plan_coverage, "planned_ranges", real)
    build_pipeline(config).run()
    done = read_committed(str(tmp_path / "output"))
    offsets = set(
        zip(done.column("partition").to_pylist(), done.column("offset").to_pylist(), strict=True)
    )
    named = message.startswith("batch 1: 1 planned range(s) not read by any task") and (
        f"{prefix}000[9] offsets 0..5: no task result" in message
    )
    matrix.record(
        group="process", fault="a planned range that reaches no task (the plan read on the "
        "driver holds one range more than the tasks were handed)", times=1,
        outcome="named error", ok=named and len(offsets) == truth.records,
        check=f"{message.split(':')[0]}: PlanNotCovered named the range, nothing of the batch "
        f"committed; the next run read all {truth.records} records once",
    )  # fmt: skip
    assert named, message
    assert len(offsets) == truth.records
