"""A checkpoint belongs to one pipeline; what a run overrode is recorded and used by the tools.

Each case was reproduced on the code before the identity check: another pipeline's run on a
checkpoint processed foreign records; a different output type mixed two schemas in one
dataset; ``validate`` judged the TOML file instead of the ``--set`` overrides that ran.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import TopicPartition as KafkaTopicPartition
from tests.e2e.cli_jobs import Halver
from tests.integration.test_validate import cli, session_config, small_simulation

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint.layout import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.ops.validate import validate
from inorder.pipeline.identity import (
    PipelineIdentity,
    RecordedSettings,
    check_identity,
    schema_change,
    schema_text,
)


@dataclass
class Recorded:
    toml: Path
    work: Path
    prefix: str
    real_output: Path


@pytest.fixture(scope="module")
def recorded_run(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """One CLI run whose output path comes from ``--set``, not from the TOML file."""
    work = tmp_path_factory.mktemp("identity")
    prefix = f"ident-{random.randrange(10**9)}-"
    simulate(small_simulation(prefix, seed=17, messages=800), kafka.bootstrap_servers)
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(session_config(kafka.bootstrap_servers, prefix, work)))
    real_output = work / "real-output"
    done = cli("run", str(toml), "--set", f"sink.path={real_output}", timeout=400)
    assert done.returncode == 0, done.stderr
    return Recorded(toml, work, prefix, real_output)


def test_set_overrides_are_recorded_and_used_by_validate(recorded_run: Recorded) -> None:
    info = CheckpointLayout.of(recorded_run.work / "checkpoint").read_info()
    assert info is not None
    settings = RecordedSettings.from_json(info["settings"])
    assert settings is not None
    assert settings.overrides == {"sink.path": str(recorded_run.real_output)}
    assert info["pipeline"]["output"] == f"ParquetSink {recorded_run.real_output}"

    target = load_target(str(recorded_run.toml))
    assert target.pipeline.sink.path == str(recorded_run.real_output)
    assert any("sink.path" in note for note in target.notes)
    report = validate(target)
    assert report.ok and sum(p.actual_rows for p in report.partitions) > 0, report.lines()

    done = cli("validate", str(recorded_run.toml), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["ok"] is True
    assert "recorded in the checkpoint" in done.stderr


@pytest.mark.parametrize(
    ("override", "named"),
    [
        # Still matching the run's topics (a pattern matching none is refused before this).
        ("source.topic_pattern={prefix}.*|other-.*", "source subscription"),
        ("pipeline.name=another", "pipeline name"),
        ("sink.path={work}/elsewhere", "output"),
    ],
)
def test_a_checkpoint_of_another_pipeline_is_refused(
    recorded_run: Recorded, override: str, named: str
) -> None:
    args = ["--set", f"sink.path={recorded_run.real_output}"] if "sink.path" not in override else []
    done = cli(
        "run",
        str(recorded_run.toml),
        *args,
        "--set",
        override.format(work=recorded_run.work, prefix=recorded_run.prefix),
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "belongs to another pipeline" in lines[0] and named in lines[0]
    assert "--accept-changes" in lines[0]


def test_an_incompatible_output_type_is_refused(recorded_run: Recorded) -> None:
    config = json.loads(json.dumps(_config_of(recorded_run)))
    pipeline = build_pipeline(config)
    # Halver has no starts_session: restart_session (the session pipeline's policy) would be
    # refused before the output type is compared.
    other = dataclasses.replace(pipeline, processor=Halver(), integrity=Integrity.strict())
    with pytest.raises(ConfigError, match="output schema changed incompatibly") as caught:
        other.run(accept_changes=True)
    assert "was removed" in str(caught.value)


def _config_of(recorded_run: Recorded) -> dict[str, Any]:
    from inorder.pipeline.config import load_toml

    config = load_toml(recorded_run.toml)
    config["sink"]["path"] = str(recorded_run.real_output)
    config["pipeline"]["progress"] = "quiet"
    return config


@pytest.mark.parametrize("max_offsets", [2000, 60])
def test_expired_records_are_not_checkable(
    kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory, max_offsets: int
) -> None:
    work = tmp_path_factory.mktemp("expired")
    prefix = f"exp-{random.randrange(10**9)}-"
    simulate(small_simulation(prefix, seed=23, messages=900), kafka.bootstrap_servers)
    config = session_config(kafka.bootstrap_servers, prefix, work, max_offsets=max_offsets)
    build_pipeline(config).run()
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(config))
    target = load_target(str(toml))
    first = validate(target)
    assert first.ok and all(p.checkable for p in first.partitions), first.lines()

    # Retention removes the first records of one partition (the output keeps their rows):
    # the largest one, so the cut lies inside it whatever the simulation's key spread.
    victim = max(first.partitions, key=lambda p: (p.to_offset or p.from_offset) - p.from_offset)
    cut = victim.from_offset + 50
    assert victim.to_offset is not None and victim.to_offset > cut, victim.line()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    futures = admin.delete_records([KafkaTopicPartition(victim.topic, victim.partition, cut)])
    for future in futures.values():
        future.result(timeout=15)

    report = validate(load_target(str(toml)))
    diff = next(
        p for p in report.partitions if (p.topic, p.partition) == (victim.topic, victim.partition)
    )
    assert not diff.checkable, diff.line()
    if max_offsets == 2000:
        # One batch covered the partition: no saved state lies past the cut, so nothing of
        # it can be recomputed (a recomputation from the cut would start from empty state).
        assert diff.unchecked_rows == victim.actual_rows and diff.records == 0
    else:
        # Saved state past the cut: rows below it are not checkable, the rest is compared.
        assert diff.unchecked_to is not None and diff.to_offset is not None
        assert cut <= diff.unchecked_to < diff.to_offset and diff.expected_rows > 0, diff.line()
        assert diff.unchecked_rows < victim.actual_rows
    assert diff.ok and diff.line().startswith("NOCHK"), diff.line()
    assert "NOT CHECKABLE" in diff.line() and "not checkable" in report.lines()[-1]
    others = [p for p in report.partitions if p is not diff]
    assert all(p.checkable for p in others)
    data = report.to_json()
    assert data["checkable"] is False


def test_schema_change_rules() -> None:
    old = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])
    added = old.append(pa.field("c", pa.float64()))
    assert schema_change(old, added) == (True, ["column 'c' (double) added"])
    assert not schema_change(old, old.append(pa.field("c", pa.int64(), nullable=False)))[0]
    assert not schema_change(old, pa.schema([pa.field("a", pa.int64(), nullable=False)]))[0]
    retyped = pa.schema([pa.field("a", pa.float64(), nullable=False), pa.field("b", pa.string())])
    assert not schema_change(old, retyped)[0]
    stricter = pa.schema([old.field("a"), pa.field("b", pa.string(), nullable=False)])
    assert not schema_change(old, stricter)[0]


def test_identity_differences_and_acceptance() -> None:
    schema = pa.schema([pa.field("a", pa.int64())])
    base = PipelineIdentity("p", "m:P", "subscribePattern=a-.*", "ParquetSink out", "")
    base = dataclasses.replace(base, output_schema=schema_text(schema))
    assert check_identity(None, base, "ck") == []
    assert check_identity(base, base, "ck") == []
    moved = dataclasses.replace(base, subscription="subscribePattern=b-.*")
    with pytest.raises(ConfigError, match="source subscription"):
        check_identity(base, moved, "ck")
    notes = check_identity(base, moved, "ck", accept_changes=True)
    assert notes and "accepted change" in notes[0]
    evolved = dataclasses.replace(
        base, output_schema=schema_text(schema.append(pa.field("z", pa.string())))
    )
    assert "evolved compatibly" in check_identity(base, evolved, "ck")[0]


def test_secrets_are_never_recorded() -> None:
    settings = RecordedSettings.of(
        "p.toml",
        {"source.kafka": {"sasl.password": "hunter2", "sasl.username": "u"}, "x.token": "t"},
        {"sink": {"storage_options": {"secret_access_key": "s3cr3t", "region": "r"}}},
    )
    text = json.dumps(settings.to_json())
    assert "hunter2" not in text and "s3cr3t" not in text and '"t"' not in text
    assert settings.replayable_overrides() == {}


def _commit(path: str, schema: pa.Schema, batch_id: int, rows: int) -> None:
    from inorder.sinks.parquet import ParquetSink

    sink = ParquetSink(path, partition_by=["topic"])
    sink.check(schema)
    writer = sink.open_writer(schema, batch_id, "t")
    columns: list[pa.Array] = [
        pa.array(["a"] * rows),
        pa.array(range(batch_id * 10, batch_id * 10 + rows), pa.int64()),
    ]
    if "note" in schema.names:
        columns.append(pa.array(["x"] * rows))
    columns.append(pa.array([batch_id] * rows, pa.int64()))
    writer.write(pa.record_batch(columns, schema=schema))
    assert sink.commit(batch_id, writer.close())


def test_parquet_output_evolves_only_compatibly(tmp_path: Path) -> None:
    """Also for outputs whose checkpoint predates recorded identities."""
    from inorder.sinks.base import SinkError
    from inorder.sinks.parquet import read_committed

    path = str(tmp_path / "out")
    old = pa.schema([("topic", pa.string()), ("offset", pa.int64()), ("batch_id", pa.int64())])
    _commit(path, old, 0, 3)
    _commit(path, old.insert(2, pa.field("note", pa.string())), 1, 2)
    table = read_committed(path)
    assert table.column("note").to_pylist() == [None, None, None, "x", "x"]
    retyped = pa.schema([("topic", pa.string()), ("offset", pa.string()), ("batch_id", pa.int64())])
    with pytest.raises(SinkError, match="changed incompatibly"):
        _commit(path, retyped, 2, 1)
