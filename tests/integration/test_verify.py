"""``inorder verify``: clean outputs of a real pipeline run verify clean; every injected fault
(a file deleted, duplicated, a row altered, a batch committed twice, a range skipped, an
uncommitted file made visible) is caught and named, from metadata and footers alone."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.fixtures.sessions_job import TWO_LOCAL_CORES, sessions_config, small_simulation

from inorder.assemble import build_pipeline, load_target
from inorder.checkpoint.layout import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.ops.repair import apply_repair, plan_repair
from inorder.ops.verify import CheckpointEnd, VerifyReport, checkpoint_end, verify
from inorder.pipeline.runner import PipelineRunner
from inorder.sinks.commit_checkpoint import write_checkpoint
from inorder.sinks.commit_keys import APP_ID_KEY, BATCH_ID_KEY, FILES_KEY, OFFSETS_KEY
from inorder.sinks.parquet import (
    COMMITS_DIR,
    ParquetSink,
    committed_files,
    list_commits,
    manifest_name,
    read_manifest,
)
from inorder.storage import fs as sfs


@dataclass
class Run:
    """A finished pipeline run: its TOML file, output and checkpoint owner."""

    toml: Path
    output: Path
    owner: str


@pytest.fixture(scope="module")
def run(kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Run:
    work = tmp_path_factory.mktemp("verify")
    prefix = f"verify-{random.randrange(10**9)}-"
    simulate(small_simulation(prefix, seed=7), kafka.bootstrap_servers)
    config = sessions_config(
        kafka.bootstrap_servers, prefix, work, name="verify", max_offsets=400, spark=TWO_LOCAL_CORES
    )
    build_pipeline(config).run()
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(config))
    info = CheckpointLayout.of(str(work / "checkpoint")).read_info() or {}
    return Run(toml, work / "output", str(info["id"]))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def copy_of(run: Run, tmp_path: Path) -> Path:
    """A copy of the run's output to inject a fault into (the run's own stays clean)."""
    target = tmp_path / "output"
    shutil.copytree(run.output, target)
    return target


def check(
    path: Path, owner: str, digests: bool = True, end: CheckpointEnd | None = None
) -> VerifyReport:
    sink = ParquetSink(str(path), partition_by=["topic"])
    return verify(sink, owner, digests=digests, end=end)


def end_of(run: Run) -> CheckpointEnd:
    """Where the run's checkpoint says its committed output ends."""
    end = checkpoint_end(load_target(str(run.toml)))
    assert end is not None
    return end


def kinds(report: VerifyReport) -> set[str]:
    return {p.kind for p in report.problems}


def manifests(path: Path) -> list[tuple[int, dict[str, Any]]]:
    loc = sfs.resolve(str(path))
    return [
        (b, read_manifest(loc, f"{COMMITS_DIR}/{manifest_name(b)}"))
        for b in list_commits(loc).manifests
    ]


def test_a_clean_run_verifies_clean_with_every_digest(run: Run) -> None:
    report = check(run.output, run.owner, end=end_of(run))
    assert report.ok, "\n".join(report.lines())
    assert report.batches >= 3 and report.files > 0
    assert report.digests_checked == report.files
    assert report.rows == sum(f.rows for f in committed_files(str(run.output)))
    # Every partition is covered from its first offset, in one piece.
    assert report.partitions and all(a < b for a, b in report.partitions.values())
    done = cli("verify", str(run.toml), "--json", "--sample", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["problems"] == [] and doc["digests_checked"] == 3


def test_folded_into_a_commit_checkpoint_it_still_verifies_clean(run: Run, tmp_path: Path) -> None:
    path = copy_of(run, tmp_path)
    assert write_checkpoint(sfs.resolve(str(path)), manifest_retention=1) is not None
    report = check(path, run.owner)
    assert report.ok, "\n".join(report.lines())
    assert report.partitions == check(run.output, run.owner).partitions


def _biggest(path: Path) -> Path:
    files = sorted(committed_files(str(path)), key=lambda f: (-f.rows, f.path))
    return path / files[0].path


def delete_a_file(path: Path) -> str:
    victim = _biggest(path)
    victim.unlink()
    return "missing_file"


def duplicate_a_file(path: Path) -> str:
    source = _biggest(path)
    shutil.copy(source, source.with_name(source.stem[:-5] + "99999.parquet"))
    return "uncommitted_visible"


def alter_a_row(path: Path) -> str:
    victim = _biggest(path)
    table = pq.read_table(victim, partitioning=None)
    ops = table.column("op").to_pylist()
    ops[len(ops) // 2] = "tampered"
    table = table.set_column(table.schema.get_field_index("op"), "op", pa.array(ops))
    pq.write_table(table, victim)  # same row count: only the digest can tell
    return "digest"


def commit_a_batch_twice(path: Path) -> str:
    """A batch's rows committed again under the next batch id (files copied, new names)."""
    (bid, manifest), last = manifests(path)[1], list_commits(sfs.resolve(str(path))).manifests[-1]
    again = last + 1
    files = []
    for n, entry in enumerate(manifest["files"]):
        final = entry["final"].rsplit("/", 1)[0] + f"/part-{again:010d}-{n:05d}.parquet"
        shutil.copy(path / entry["final"], path / final)
        files.append({**entry, "final": final})
    commits = path / COMMITS_DIR
    doc = {**manifest, "batch_id": again, "files": files}
    (commits / manifest_name(again)).write_text(json.dumps(doc))
    (commits / f"{again:020d}.done").write_text("{}")
    assert bid != again
    return "committed_twice"


def skip_a_range(path: Path) -> str:
    """A middle batch vanishes from the commit log with its files: its offsets are in none."""
    listed = manifests(path)
    bid, manifest = next(
        (b, m) for b, m in listed[1:-1] if any(a < e for a, e in m["offsets"].values())
    )
    for entry in manifest["files"]:
        (path / entry["final"]).unlink()
    (path / COMMITS_DIR / manifest_name(bid)).unlink()
    (path / COMMITS_DIR / f"{bid:020d}.done").unlink()
    return "gap"


def make_an_uncommitted_file_visible(path: Path) -> str:
    """Rows of a batch that never committed, published under a data file name."""
    source = _biggest(path)
    table = pq.read_table(source, partitioning=None)
    offsets = pc.add(table.column("offset"), pa.scalar(10**6, pa.int64()))
    table = table.set_column(table.schema.get_field_index("offset"), "offset", offsets)
    last = list_commits(sfs.resolve(str(path))).manifests[-1]
    pq.write_table(table, source.parent / f"part-{last + 1:010d}-00000.parquet")
    return "uncommitted_visible"


def lose_the_last_batch(path: Path) -> str:
    """The newest batch's commit vanishes with its files: no range check can see it, the
    checkpoint's committed end does."""
    bid, manifest = manifests(path)[-1]
    for entry in manifest["files"]:
        (path / entry["final"]).unlink()
    (path / COMMITS_DIR / manifest_name(bid)).unlink()
    (path / COMMITS_DIR / f"{bid:020d}.done").unlink()
    return "missing_batch"


FAULTS: list[Callable[[Path], str]] = [
    delete_a_file,
    duplicate_a_file,
    alter_a_row,
    commit_a_batch_twice,
    skip_a_range,
    make_an_uncommitted_file_visible,
    lose_the_last_batch,
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.__name__ for f in FAULTS])
def test_every_injected_fault_is_caught_and_named(
    run: Run, tmp_path: Path, fault: Callable[[Path], str]
) -> None:
    path = copy_of(run, tmp_path)
    expected = fault(path)
    report = check(path, run.owner, end=end_of(run))
    assert expected in kinds(report), "\n".join(report.lines())
    line = next(p.line() for p in report.problems if p.kind == expected)
    assert line.startswith(f"PROBLEM {expected}") and "batch " in line
    assert "file " in line or "partition " in line


def test_the_command_exits_1_with_one_line_per_problem(run: Run, tmp_path: Path) -> None:
    path = copy_of(run, tmp_path)
    delete_a_file(path)
    done = cli("verify", str(run.toml), "--set", f"sink.path={path}")
    assert done.returncode == 1, done.stdout + done.stderr
    problems = [line for line in done.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1 and "missing_file" in problems[0], done.stdout
    assert done.stdout.rstrip().endswith("1 problem(s)")


# -- Delta and Iceberg tables ------------------------------------------------------------------


@dataclass
class TableRun:
    """A finished pipeline run writing a Delta or an Iceberg table."""

    kind: str
    sink: Any
    owner: str
    work: Path


def _table_sink(kind: str, work: Path) -> dict[str, Any]:
    if kind == "delta":
        return {"type": "delta", "path": str(work / "table"), "partition_by": ["topic"]}
    return {
        "type": "iceberg",
        "path": str(work / "warehouse"),
        "table": "verify.changes",
        "catalog_file": str(work / "catalog.db"),
        "partition_by": ["topic"],
    }


@pytest.fixture(scope="module", params=["delta", "iceberg"])
def table_run(
    request: pytest.FixtureRequest, kafka: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> TableRun:
    kind = str(request.param)
    work = tmp_path_factory.mktemp(f"verify-{kind}")
    prefix = f"verify-{kind}-{random.randrange(10**9)}-"
    simulate(small_simulation(prefix, seed=11), kafka.bootstrap_servers)
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        work,
        name=f"verify-{kind}",
        max_offsets=400,
        spark=TWO_LOCAL_CORES,
        sink=_table_sink(kind, work),
    )
    pipeline = build_pipeline(config)
    pipeline.run()
    info = CheckpointLayout.of(str(work / "checkpoint")).read_info() or {}
    sink = pipeline.sink
    while hasattr(sink, "inner"):
        sink = sink.inner
    return TableRun(kind, sink, str(info["id"]), work)


def test_a_clean_table_verifies_clean(table_run: TableRun) -> None:
    layout = CheckpointLayout.of(str(table_run.work / "checkpoint"))
    end = checkpoint_end(SimpleNamespace(spark_dir=layout.spark_dir, batch_offset=0, layout=layout))
    assert end is not None
    report = verify(table_run.sink, table_run.owner, digests=True, end=end)
    assert report.ok, "\n".join(report.lines())
    assert report.batches >= 3 and report.digests_checked == report.files > 0
    assert report.partitions and all(a < b for a, b in report.partitions.values())


def _live_file(table_run: TableRun) -> Path:
    report = verify(table_run.sink, table_run.owner)
    biggest = max(report.live_files, key=lambda f: (f.rows, f.path))
    return Path(table_run.sink.location.join(biggest.path))


def test_a_deleted_or_altered_table_file_is_caught(table_run: TableRun) -> None:
    victim = _live_file(table_run)
    original = victim.read_bytes()
    try:
        table = pq.read_table(victim, partitioning=None)
        ops = table.column("op").to_pylist()
        ops[0] = "tampered"
        pq.write_table(
            table.set_column(table.schema.get_field_index("op"), "op", pa.array(ops)), victim
        )
        assert "digest" in kinds(verify(table_run.sink, table_run.owner, digests=True))
        victim.unlink()
        report = verify(table_run.sink, table_run.owner)
        assert kinds(report) == {"missing_file"}, "\n".join(report.lines())
    finally:
        victim.write_bytes(original)
    assert verify(table_run.sink, table_run.owner, digests=True).ok


def _commit_again(table_run: TableRun, batch: int) -> None:
    """Commit batch ``batch``'s rows a second time, as a driver before the guard could:
    its files copied under new names, its commit metadata repeated."""
    sink = table_run.sink
    proof = next(b for b in verify(sink, table_run.owner).evidence_batches if b.batch_id == batch)
    copies = {}
    for f in proof.files:
        copy = f.path.removesuffix(".parquet") + "-again.parquet"
        shutil.copy(sink.location.join(f.path), sink.location.join(copy))
        copies[copy] = [f.rows, f.digest]
    metadata = {
        APP_ID_KEY: sink.app_id,
        BATCH_ID_KEY: str(batch),
        OFFSETS_KEY: json.dumps({k: list(v) for k, v in (proof.offsets or {}).items()}),
        FILES_KEY: json.dumps(copies),
    }
    if table_run.kind == "delta":
        from deltalake import DeltaTable
        from deltalake.transaction import AddAction, CommitProperties

        table = DeltaTable(sink.location.delta_uri())
        actions = [
            AddAction(
                path=path,
                size=Path(sink.location.join(path)).stat().st_size,
                partition_values={"topic": path.split("/")[0].removeprefix("topic=")},
                modification_time=0,
                data_change=True,
                stats=json.dumps({"numRecords": rows}),
            )
            for path, (rows, _) in copies.items()
        ]
        table.create_write_transaction(
            actions,
            mode="append",
            schema=pa.schema(table.schema().to_arrow()),
            partition_by=["topic"],
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
    else:
        loaded = sink.load_table()
        root = loaded.location().rstrip("/")
        tx = loaded.transaction()
        tx.add_files([f"{root}/{p}" for p in copies], snapshot_properties=metadata)
        tx.commit_transaction()


def test_a_table_batch_committed_twice_is_caught(table_run: TableRun) -> None:
    # Last of this module's table tests: the table keeps the second commit.
    _commit_again(table_run, 1)
    report = verify(table_run.sink, table_run.owner, digests=True)
    assert "committed_twice" in kinds(report), "\n".join(report.lines())
    line = next(p.line() for p in report.problems if p.kind == "committed_twice")
    assert "batch 1" in line, line


def test_dead_letters_are_verified_beside_the_output(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    prefix = f"verify-dl-{random.randrange(10**9)}-"
    simulate(small_simulation(prefix, seed=5, faulty=0.4), kafka.bootstrap_servers)
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        name="verify-dl",
        max_offsets=600,
        spark=TWO_LOCAL_CORES,
        integrity={"on_violation": "dead_letter"},
    )
    build_pipeline(config).run()
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    done = cli("verify", str(toml), "--json", "--digests")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["dead_letter"]["ok"] is True
    assert doc["dead_letter"]["files"] > 0
    assert doc["dead_letter"]["digests_checked"] == doc["dead_letter"]["files"]
    assert doc["dead_letter"]["notes"] == []


def test_a_repaired_output_verifies_clean_against_its_checkpoint(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    """After ``inorder repair`` the next range of a partition starts where the repair cut it,
    inside an earlier batch's range: the repaired checkpoint says so, and verify accepts it."""
    prefix = f"verify-repair-{random.randrange(10**9)}-"
    simulate(small_simulation(prefix, seed=9), kafka.bootstrap_servers)
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        name="verify-repair",
        max_offsets=300,
        spark=TWO_LOCAL_CORES,
    )
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    PipelineRunner(build_pipeline(config), stop_after_batches=2).run()
    # The crash: every partition's state is gone, Spark's logs are intact.
    state = tmp_path / "checkpoint" / "engine" / "state"
    for victim in sorted(p for p in state.glob("*/*") if p.is_dir()):
        shutil.rmtree(victim)
    shutil.rmtree(state / "_deltas", ignore_errors=True)  # the task files (state format 3)
    build_pipeline(config).run()
    target = load_target(str(toml))
    plan = apply_repair(target, plan_repair(target, use_validate=True))
    assert plan.applied and plan.batch_offset > 0
    build_pipeline(config).run()
    target = load_target(str(toml))
    end = checkpoint_end(target)
    assert end is not None and end.restart_batch == plan.batch_offset
    owner = str((target.layout.read_info() or {})["id"])
    report = check(tmp_path / "output", owner, end=end)
    assert report.ok, "\n".join(report.lines())
    # Without the checkpoint the restart is a range committed again that nothing explains.
    assert kinds(check(tmp_path / "output", owner)) & {"overlap", "committed_twice"}
