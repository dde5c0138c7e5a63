"""kill -9 of a process writing through the sink API, and readers racing writers and compaction.

The final datasets are checked with pyarrow / DuckDB / deltalake directly, not with the
sink's own reader.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
from tests.fixtures.sink_cases import (
    assert_whole_batches,
    committed_ids,
    stage_batch,
    writer_env,
)

from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import ParquetSink

SCRIPT = Path(__file__).parent / "scripts" / "sink_crash_writer.py"
BATCHES = 30
ROWS = 2000
KILLS = 6


@dataclasses.dataclass(frozen=True)
class Kill:
    """Where a run is killed: after its ``commits``-th batch line, a ``fraction`` of a batch
    later (placed by the writer's own progress, whatever the machine's speed)."""

    commits: int
    fraction: float


def _run(fmt: str, path: str, env: dict[str, str], kill: Kill | None, rerun: bool) -> str:
    """Run the writer; with ``kill``, SIGKILL it at that point of its writing."""
    args = [sys.executable, str(SCRIPT), fmt, path, str(BATCHES), str(ROWS)]
    if rerun:
        args.append("--rerun-last")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if kill is None:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
        return out.decode()
    assert proc.stdout is not None
    lines = [proc.stdout.readline().decode()]  # "ready": imports and check() are done
    batch_seconds = 0.05  # until this run has written a batch: about one local batch
    last = time.monotonic()
    seen = 0
    while seen < kill.commits and lines[-1] and not lines[-1].startswith("finished"):
        lines.append(proc.stdout.readline().decode())
        now = time.monotonic()
        if lines[-1].startswith(("committed", "skipped")):
            seen += 1
            batch_seconds, last = now - last, now
    try:
        proc.wait(timeout=kill.fraction * batch_seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
    return "".join(lines) + out.decode()


class Poller(threading.Thread):
    """Reads the committed data in a loop and checks every snapshot."""

    def __init__(self, read: Any) -> None:
        super().__init__(daemon=True)
        self.read = read
        self.stop = threading.Event()
        self.snapshots = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                ids = self.read()
                assert_whole_batches(ids, ROWS)
                self.snapshots += 1
            except AssertionError as exc:
                self.errors.append(str(exc))
            except Exception as exc:  # a reader must never fail either
                self.errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)


def _parquet_ids_independent(path: str, s3: Any | None) -> list[int]:
    if s3 is None:
        rows = (
            duckdb.connect()
            .execute(f"select id from read_parquet('{path}/*/*.parquet', hive_partitioning=true)")
            .fetchall()
        )
        return [r[0] for r in rows]
    fs = s3.pyarrow_fs()
    root = path.removeprefix("s3://")
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    files = [
        i.path
        for i in infos
        if i.type == pafs.FileType.File
        and "/_inorder/" not in i.path
        and i.path.endswith(".parquet")
    ]
    table = ds.dataset(files, filesystem=fs, format="parquet").to_table(columns=["id"])
    return list(table.column("id").to_pylist())


def _delta_ids(path: str, s3: Any | None) -> list[int]:
    from deltalake import DeltaTable

    options = s3.storage_options() if s3 is not None else None
    table: pa.Table = DeltaTable(path, storage_options=options).to_pyarrow_table(columns=["id"])
    return list(table.column("id").to_pylist())


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_kill9_during_writes_keeps_every_row_exactly_once(
    fmt: str, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    path = s3.new_prefix() if s3 is not None else str(tmp_path / "out")
    env = writer_env(s3)
    # A seed of its own per case, the same in every process (str hashes are salted per process).
    rng = random.Random(f"sink-crash-{fmt}-{where}")
    if fmt == "parquet":
        options = s3.storage_options() if s3 is not None else None
        poller = Poller(lambda: committed_ids(path, options))
    else:
        poller = Poller(lambda: _delta_ids(path, s3))
    outputs: list[str] = []
    started = False
    killed_runs = 0
    for attempt in range(4 * KILLS):
        # Kill at a random moment of the writing (staging, committing or publishing), placed
        # by the batches this run has written: 0-2 of them, then a fraction of the next.
        kill = Kill(rng.randint(0, 2), rng.random())
        out = _run(fmt, path, env, kill, rerun=attempt % 2 == 1)
        outputs.append(out)
        killed_runs += "finished" not in out
        if not started and "committed" in out:
            poller.start()
            started = True
        if killed_runs >= KILLS and started:
            break
    assert killed_runs >= KILLS, outputs
    assert any("committed" in o for o in outputs), "no run got as far as a commit"
    final = _run(fmt, path, env, None, rerun=True)
    assert "finished" in final
    if started:
        poller.stop.set()
        poller.join(timeout=30)
        assert not poller.errors, poller.errors[:3]
    ids = _parquet_ids_independent(path, s3) if fmt == "parquet" else _delta_ids(path, s3)
    assert len(ids) == BATCHES * ROWS
    assert_whole_batches(ids, ROWS, BATCHES)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_reader_never_sees_partial_or_duplicated_data_during_writes_and_compaction(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    s3 = request.getfixturevalue("s3") if where == "s3" else None
    path = s3.new_prefix() if s3 is not None else str(tmp_path / "out")
    options = s3.storage_options() if s3 is not None else None
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from sink_crash_writer import (  # type: ignore[import-not-found]
            SCHEMA,
            batch_rows,
        )
    finally:
        sys.path.pop(0)
    sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.check(SCHEMA)
    poller = Poller(lambda: committed_ids(path, options))
    poller.start()
    compactions = {"runs": 0, "merged": 0}
    failures: list[BaseException] = []
    done = threading.Event()

    def compactor() -> None:
        while not done.is_set():
            # Grace 0: replaced files are deleted at once, the hardest case for readers.
            try:
                report = compact_parquet(
                    path, options, target_file_size=4 * 1024 * 1024, grace_seconds=0
                )
            except BaseException as exc:
                failures.append(exc)
                return
            compactions["runs"] += 1
            compactions["merged"] += sum(len(g) for g in report.groups)
            time.sleep(0.02)

    thread = threading.Thread(target=compactor, daemon=True)
    thread.start()
    batches = 20
    for batch_id in range(batches):
        files = stage_batch(sink, batch_id, batch_rows(batch_id, ROWS), key="task")
        assert sink.commit(batch_id, files) is True
        time.sleep(0.02)
        if batch_id == batches // 2:  # make sure compaction overlaps the second half
            deadline = time.monotonic() + 30
            while not compactions["merged"] and not failures and time.monotonic() < deadline:
                time.sleep(0.05)
    done.set()
    thread.join(timeout=60)
    assert not failures, failures
    poller.stop.set()
    poller.join(timeout=30)
    assert not poller.errors, poller.errors[:3]
    assert poller.snapshots > 5 and compactions["merged"] > 0, (poller.snapshots, compactions)
    compact_parquet(path, options, grace_seconds=0)
    ids = _parquet_ids_independent(path, s3)
    assert sorted(ids) == list(range(batches * ROWS))
