"""Commit checkpoints of the Parquet sink: a bounded commit log, on local disk and on S3.

Every result is checked with readers independent of the sink (a listing pyarrow reader) as
well as with the sink's own consistent reader, and from a fresh view (per-process caches
dropped) so that deleted manifests are really not needed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from tests.fixtures.sink_cases import (
    ID_SCHEMA,
    assert_whole_batches,
    committed_ids,
    id_batch,
    stage_batch,
    writer_env,
)

from inorder.sinks import parquet as sp
from inorder.sinks.base import SinkError, WrittenFile
from inorder.sinks.compaction import compact_parquet
from inorder.sinks.parquet import ParquetSink
from inorder.storage import fs as sfs

SCRIPT = Path(__file__).parent / "scripts" / "checkpoint_crash_writer.py"
ROWS = 20


def stage(sink: ParquetSink, batch_id: int) -> list[WrittenFile]:
    """Stage one batch of ``ROWS`` ids through two task writers, as executors would."""
    return stage_batch(sink, batch_id, id_batch(batch_id, ROWS), key="task")


def checkpointing_sink(
    path: str,
    options: dict[str, str] | None,
    interval: int,
    retention: int = sp.DEFAULT_MANIFEST_RETENTION,
) -> ParquetSink:
    """A checked sink partitioned by topic that writes a commit checkpoint every ``interval``
    batches and keeps the manifests of ``retention`` batches."""
    sink = ParquetSink(
        path,
        partition_by=["topic"],
        storage_options=options,
        checkpoint_interval=interval,
        manifest_retention=retention,
    )
    sink.check(ID_SCHEMA)
    return sink


def fresh_process_view() -> None:
    """Forget cached manifests and checkpoints, as a new process would start."""
    sp._MANIFEST_CACHE.clear()
    sp._CHECKPOINT_CACHE.clear()
    sp._FILES_CACHE.clear()


def meta_files(path: str, options: dict[str, str] | None, directory: str) -> list[str]:
    loc = sfs.resolve(path, options)
    return sorted(i.base_name for i in sfs.list_files(loc, loc.join(directory)))


def listed_ids(path: str, options: dict[str, str] | None) -> list[int]:
    """Ids of every published data file, read by listing (not through the sink's log)."""
    loc = sfs.resolve(path, options)
    files = [
        i.path
        for i in sfs.list_files(loc, loc.root, recursive=True)
        if "/_inorder/" not in i.path and i.path.endswith(".parquet")
    ]
    if not files:
        return []
    table = ds.dataset(files, filesystem=loc.filesystem, format="parquet").to_table(columns=["id"])
    return list(table.column("id").to_pylist())


def test_commit_log_stays_bounded_with_compaction(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    path, options = sink_location
    interval, retention = 4, 3
    batches = 48 if options is None else 32
    sink = checkpointing_sink(path, options, interval, retention)
    most = 0
    for batch_id in range(batches):
        assert sink.commit(batch_id, stage(sink, batch_id)) is True
        # Grace 0: replaced files go at once, so listing readers stay exact. The last batches
        # keep their own files (a short read_batches range then uses their manifests).
        if batch_id % 5 == 4 and batch_id < batches - 10:
            compact_parquet(path, options, grace_seconds=0, full=True)
        most = max(most, len(meta_files(path, options, sp.COMMITS_DIR)))
    commits = meta_files(path, options, sp.COMMITS_DIR)
    compactions = meta_files(path, options, sp.COMPACTIONS_DIR)
    # Manifests + markers after min(newest - retention, previous checkpoint), plus the two
    # newest checkpoints: independent of the number of batches.
    bound = 2 * (interval + max(interval, retention)) + 2
    assert most <= bound, (most, commits)
    assert sum(n.endswith(sp.CHECKPOINT_SUFFIX) for n in commits) == 2, commits
    assert f"{0:020d}.json" not in commits
    assert len(compactions) <= 9, compactions  # records folded twice over are gone
    fresh_process_view()
    assert_whole_batches(committed_ids(path, options), ROWS, batches)
    assert_whole_batches(listed_ids(path, options), ROWS, batches)

    reader = ParquetSink(path, partition_by=["topic"], storage_options=options)
    assert all(reader.is_committed(b) for b in range(batches))
    assert not reader.is_committed(batches)
    assert reader.last_committed_batch() == batches - 1
    old = reader.read_batches(0, 2, columns=["id"])  # manifests deleted long ago
    assert sorted(old.column("id").to_pylist()) == list(range(3 * ROWS))
    new = reader.read_batches(batches - 2, batches - 1, columns=["batch_id"])
    assert sorted(set(new.column("batch_id").to_pylist())) == [batches - 2, batches - 1]
    # A short range over deleted (before) and kept (after) manifests.
    assert not os.path.exists(os.path.join(path, sp.COMMITS_DIR, f"{batches - 8:020d}.json"))
    mixed = reader.read_batches(batches - 8, batches - 1, columns=["batch_id"])
    assert Counter(mixed.column("batch_id").to_pylist()) == {
        b: ROWS for b in range(batches - 8, batches)
    }
    everything = reader.read_batches(0, batches + 5, columns=["id"])
    assert sorted(everything.column("id").to_pylist()) == list(range(batches * ROWS))

    # A restarted writer re-running old and new batches changes nothing.
    again = checkpointing_sink(path, options, interval, retention)
    assert again.commit(1, stage(again, 1)) is False
    assert again.commit(batches - 1, stage(again, batches - 1)) is False
    assert again.commit(batches, stage(again, batches)) is True
    fresh_process_view()
    assert_whole_batches(listed_ids(path, options), ROWS, batches + 1)
    assert_whole_batches(committed_ids(path, options), ROWS, batches + 1)
    assert not [n for n in meta_files(path, options, "_inorder/staging") if n]


def test_checkpoint_can_be_disabled(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    sink = checkpointing_sink(path, None, interval=0)
    for batch_id in range(6):
        sink.commit(batch_id, stage(sink, batch_id))
    assert len(meta_files(path, None, sp.COMMITS_DIR)) == 12


def test_bad_checkpoint_options_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="checkpoint_interval"):
        ParquetSink(str(tmp_path), checkpoint_interval=-1)
    with pytest.raises(SinkError, match="manifest_retention"):
        ParquetSink(str(tmp_path), manifest_retention=0)


def test_a_pending_manifest_is_never_folded_nor_deleted(tmp_path: Path) -> None:
    """A batch committed but not published stops the checkpoint before it."""
    path = str(tmp_path / "out")
    sink = checkpointing_sink(path, None, interval=100)
    for batch_id in range(5):
        sink.commit(batch_id, stage(sink, batch_id))
    loc = sink.location
    done = loc.join(sp.COMMITS_DIR, f"{2:020d}.done")
    os.unlink(done)  # as if the driver died between the manifest and its marker
    from inorder.sinks.commit_checkpoint import write_checkpoint

    assert write_checkpoint(loc, manifest_retention=1) == 1
    assert os.path.exists(loc.join(sp.COMMITS_DIR, f"{2:020d}.json"))
    fresh_process_view()
    state = sp.load_state(loc)
    assert state.checkpoint == 1 and state.pending == [f"{sp.COMMITS_DIR}/{2:020d}.json"]
    # The next writer finishes batch 2; every row is there once.
    checkpointing_sink(path, None, interval=100)
    assert_whole_batches(committed_ids(path, None), ROWS, 5)


def test_readers_never_see_a_partial_view_while_checkpoints_are_written(
    sink_location: tuple[str, dict[str, str] | None],
) -> None:
    """Readers poll while a writer checkpoints every 2 batches and a compactor runs."""
    path, options = sink_location
    sink = checkpointing_sink(path, options, interval=2, retention=1)
    errors: list[str] = []
    snapshots = Counter[str]()
    stop = threading.Event()

    def poll(name: str, read: Any) -> None:
        while not stop.is_set():
            try:
                assert_whole_batches(read(), ROWS)
                snapshots[name] += 1
            except Exception as exc:
                errors.append(f"{name}: {type(exc).__name__}: {exc}")

    def probe() -> list[int]:
        # A fresh reader each time: no manifest cache to hide a deleted file.
        fresh_process_view()
        reader = ParquetSink(path, storage_options=options)
        last = reader.last_committed_batch()
        if last is not None:
            assert reader.is_committed(0) and reader.is_committed(last)
        return committed_ids(path, options)

    def compactor() -> None:
        while not stop.is_set():
            try:
                compact_parquet(path, options, grace_seconds=0.2)
            except Exception as exc:
                errors.append(f"compactor: {type(exc).__name__}: {exc}")
            time.sleep(0.05)

    threads = [
        threading.Thread(
            target=poll, args=("read_committed", lambda: committed_ids(path, options))
        ),
        threading.Thread(target=poll, args=("fresh", probe)),
        threading.Thread(target=compactor),
    ]
    for t in threads:
        t.start()
    batches = 30 if options is None else 20
    try:
        for batch_id in range(batches):
            assert sink.commit(batch_id, stage(sink, batch_id)) is True
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[:3]
    assert snapshots["read_committed"] > 3 and snapshots["fresh"] > 3, snapshots
    fresh_process_view()
    assert_whole_batches(committed_ids(path, options), ROWS, batches)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_kill9_during_checkpoint_write_and_cleanup(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """kill -9 of the writer: by itself at the n-th checkpoint step (the write or a delete)
    in even rounds, from outside at a random moment in odd rounds."""
    s3 = request.getfixturevalue("s3") if backend == "s3" else None
    path = s3.new_prefix() if s3 is not None else str(tmp_path / "out")
    options = s3.storage_options() if s3 is not None else None
    env = writer_env(s3)
    rng = random.Random(7 if s3 is None else 8)
    batches = 0
    kills = 0
    round_ = -1
    # Ten rounds; a random-moment kill can miss (the writer finished first on a quiet
    # machine), so rounds go on, up to 20, until at least six kills landed.
    while round_ < 9 or (kills < 6 and round_ < 19):
        round_ += 1
        batches += 6
        die_at = rng.randrange(1, 14) if round_ % 2 == 0 else 0
        args = [sys.executable, str(SCRIPT), path, str(batches), str(ROWS), str(die_at)]
        proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        if not die_at:
            assert proc.stdout is not None
            proc.stdout.readline()  # "ready": imports and check() are done
            try:
                proc.wait(timeout=rng.random() * (0.4 if s3 is None else 1.0))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, -signal.SIGKILL), err[-2000:]
        kills += proc.returncode == -signal.SIGKILL
        # After every crash: a readable dataset, whole batches, nothing twice.
        fresh_process_view()
        assert_whole_batches(committed_ids(path, options), ROWS)
        if die_at:
            # Killed in a checkpoint step: the batch and the compaction before it were
            # complete, so even a listing reader sees exact data. (A kill at a random moment
            # may leave a batch half published or a compaction's replaced files, which a
            # listing reader sees until the next run finishes them: docs/sinks.md.)
            assert_whole_batches(listed_ids(path, options), ROWS)
    assert kills >= 6, kills
    final = subprocess.run(
        [sys.executable, str(SCRIPT), path, str(batches), str(ROWS), "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert final.returncode == 0, final.stderr[-2000:]
    compact_parquet(path, options, grace_seconds=0)  # deletes what killed compactions left
    fresh_process_view()
    assert_whole_batches(committed_ids(path, options), ROWS, batches)
    assert_whole_batches(listed_ids(path, options), ROWS, batches)
    reader = ParquetSink(path, storage_options=options)
    assert all(reader.is_committed(b) for b in range(batches))
    assert reader.last_committed_batch() == batches - 1
    assert len(meta_files(path, options, sp.COMMITS_DIR)) <= 2 * (3 + 3) + 2 + 2


def test_the_checkpoint_a_process_writes_is_what_a_fresh_process_reads(tmp_path: Path) -> None:
    """The writer keeps the checkpoint it created (and its files) cached instead of reading
    it back: its state, and the next checkpoint built on it, equal a fresh process's, also
    over a checkpoint whose entries an older release wrote (explicit level 0, no commit
    time)."""
    path = str(tmp_path / "out")
    sink = checkpointing_sink(path, None, interval=4, retention=2)
    loc = sink.location
    for batch_id in range(6):
        assert sink.commit(batch_id, stage(sink, batch_id)) is True
        if batch_id == 2:
            compact_parquet(path, grace_seconds=0, full=True)
        sp.load_state(loc, include_pending_compactions=True)  # as the compactor's rounds do
    # Batch 3 wrote the checkpoint: kept cached with its files as the writer built them.
    cached = sp.load_state(loc)
    assert cached.checkpoint == 3
    fresh_process_view()
    fresh = sp.load_state(loc)
    assert list(cached.files.items()) == list(fresh.files.items())
    assert cached.offsets == fresh.offsets and list(cached.batches) == list(fresh.batches)
    assert any(f.level == 1 for f in fresh.files.values())  # the compaction is folded in

    # The checkpoint as an older release wrote its entries: the next one still builds on it.
    rel = os.path.join(path, sp.COMMITS_DIR, sp.checkpoint_name(3))
    with open(rel) as f:
        doc = json.load(f)
    for entry in doc["files"]:
        entry.setdefault("level", 0)
        entry.pop("committed_at", None)
    with open(rel, "w") as f:
        json.dump(doc, f)
    fresh_process_view()
    older = sp.load_state(loc)
    sink = checkpointing_sink(path, None, interval=4, retention=2)
    for batch_id in range(6, 8):
        assert sink.commit(batch_id, stage(sink, batch_id)) is True
    cached = sp.load_state(loc)
    assert cached.checkpoint == 7
    fresh_process_view()
    fresh = sp.load_state(loc)
    assert list(cached.files.items()) == list(fresh.files.items())
    assert {p: f for p, f in fresh.files.items() if p in older.files} == older.files
    assert_whole_batches(committed_ids(path, None), ROWS, 8)
    assert_whole_batches(listed_ids(path, None), ROWS, 8)
