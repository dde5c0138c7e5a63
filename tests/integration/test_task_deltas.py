"""State format 3: one delta file per task and batch (``StateOptions(delta_files="task")``).

Every partition's state at every version must equal the same batches committed with a file
per partition (format 2): through the cache, rebuilt from the files alone, re-run after an
attempt that did not commit, and through the ops tools' reader. Task files no partition
needs go; a checkpoint of format 2 goes on in format 3.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.property.procs import Tally

from inorder.checkpoint.state_files import load_partition_state, loadable_versions
from inorder.errors import StorageError
from inorder.records import TopicPartition
from inorder.state.checkpoint import CheckpointStore
from inorder.state.codec import StateCodec
from inorder.state.entry import KeyEntry, PartitionMeta
from inorder.state.store import PartitionStore, StateOptions
from inorder.state.store_commit import commit_partitions
from inorder.state.task_deltas import DELTAS_DIR, TaskFiles

CODEC = StateCodec(Tally)
TPS = [TopicPartition(f"site-{i // 2}", i % 2) for i in range(6)]
KEYS = "abcdef"


def entry(n: int) -> KeyEntry:
    return KeyEntry(Tally(n, n * 10, [n]), last_offset=n, timer=n if n % 3 == 0 else None)


class Job:
    """A task committing all of :data:`TPS` in each batch, in one mode."""

    def __init__(
        self,
        root: Path | str,
        cache: Path,
        mode: str,
        interval: int,
        retain: int,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.checkpoint = CheckpointStore(str(root), storage_options)
        self.options = StateOptions(
            snapshot_interval=interval,
            retain_versions=retain,
            cache_dir=str(cache),
            delta_files=mode,
        )

    def stores(self, batch_id: int, tps: list[TopicPartition]) -> list[PartitionStore]:
        listed = self.checkpoint.task_files()
        stores = [
            PartitionStore(self.checkpoint, tp, CODEC, "e", self.options, listed=listed)
            for tp in tps
        ]
        for store in stores:
            store.open(batch_id)
        return stores

    def batch(
        self, batch_id: int, changes: list[dict[str, KeyEntry | None]], tasks: int = 1
    ) -> None:
        """Batch ``batch_id`` in ``tasks`` tasks (each a share of the partitions)."""
        for task in range(tasks):
            mine = [i for i in range(len(TPS)) if i % tasks == task]
            stores = self.stores(batch_id, [TPS[i] for i in mine])
            with self.checkpoint.durable_together():
                commit_partitions(
                    (store, changes[i], PartitionMeta(batch_id * 100 + i, None))
                    for i, store in zip(mine, stores, strict=True)
                )
            for store in stores:
                store.close()

    def state(self, batch_id: int, cache: Path | None = None) -> list[Any]:
        """Every partition's keys and meta as a batch ``batch_id`` would open them."""
        options = self.options
        if cache is not None:
            options = dataclasses.replace(options, cache_dir=str(cache))
        found = []
        listed = self.checkpoint.task_files()
        for tp in TPS:
            with PartitionStore(self.checkpoint, tp, CODEC, "e", options, listed=listed) as store:
                view, meta = store.open(batch_id)
                keys = {}
                for key in KEYS:
                    e = view.load(key)
                    if e is not None:
                        keys[key] = (e.state, e.last_offset, e.timer)
                assert store.key_count() == len(keys)
                found.append((keys, meta.last_offset))
        return found


def random_changes(rng: random.Random, batch_id: int) -> list[dict[str, KeyEntry | None]]:
    out: list[dict[str, KeyEntry | None]] = []
    for _ in TPS:
        changes: dict[str, KeyEntry | None] = {}
        for key in rng.sample(KEYS, rng.randint(0, 3)):
            changes[key] = None if rng.random() < 0.2 else entry(batch_id * 10 + rng.randint(0, 9))
        out.append(changes)
    return out


@pytest.mark.parametrize(("interval", "retain", "seed"), [(2, 0, 1), (3, 1, 2), (4, 6, 3)])
def test_task_files_hold_the_same_state_as_files_per_partition(
    tmp_path: Path, interval: int, retain: int, seed: int
) -> None:
    rng = random.Random(seed)
    per_part = Job(tmp_path / "p", tmp_path / "pc", "partition", interval, retain)
    per_task = Job(tmp_path / "t", tmp_path / "tc", "task", interval, retain)
    for b in range(14):
        changes = random_changes(rng, b)
        if b % 5 == 3:  # an attempt that does not commit, then the batch again
            per_task.batch(b, random_changes(rng, b))
            assert per_task.state(b, tmp_path / f"rerun-{b}") == per_part.state(b)
        per_part.batch(b, changes)
        per_task.batch(b, changes)
        # One task file per batch, no per-partition deltas.
        listed = TaskFiles(per_task.checkpoint.location, str(tmp_path / "t/state" / DELTAS_DIR))
        assert sorted({f.version for f in listed.files})[-1] == b
        assert len([f for f in listed.files if f.version == b]) == 1
        assert not list((tmp_path / "t/state").glob("site-*/*/*.delta.*"))
        assert per_task.state(b + 1) == per_part.state(b + 1)  # the cache
        assert per_task.state(b + 1, tmp_path / f"cold-{b}") == per_part.state(b + 1)
        for tp in TPS:  # the ops tools' reader
            versions = loadable_versions(per_task.checkpoint.versions(tp))
            assert versions == loadable_versions(per_part.checkpoint.versions(tp))
            for v in versions[-2:]:
                got = load_partition_state(per_task.checkpoint, tp, v)
                want = load_partition_state(per_part.checkpoint, tp, v)
                assert got.entries == want.entries and got.meta == want.meta
    # Old task files went as the partitions' snapshots moved on: a bounded number is left.
    left = TaskFiles(per_task.checkpoint.location, str(tmp_path / "t/state" / DELTAS_DIR))
    assert 0 < len(left.files) <= 2 * interval + retain + 2, [f.version for f in left.files]
    assert min(f.version for f in left.files) > 0


def switch_layouts(tmp_path: Path, first: str, then: str, interval: int, seed: int) -> Job:
    """Batches 0-3 written with ``first`` deltas, 4-11 with ``then``, each version's state
    checked against a checkpoint of files per partition throughout; the last job."""
    rng = random.Random(seed)
    reference = Job(tmp_path / "r", tmp_path / "rc", "partition", interval, 1)
    before = Job(tmp_path / "x", tmp_path / "xc", first, interval, 1)
    after = Job(tmp_path / "x", tmp_path / "xc", then, interval, 1)
    for b in range(12):
        changes = random_changes(rng, b)
        reference.batch(b, changes)
        (before if b < 4 else after).batch(b, changes)
        assert after.state(b + 1, tmp_path / f"cold-{b}") == reference.state(b + 1)
    assert after.state(12) == reference.state(12)
    return after


def test_a_format_2_checkpoint_goes_on_in_task_files(tmp_path: Path) -> None:
    switch_layouts(tmp_path, "partition", "task", 3, 7)
    # The per-partition deltas went with the snapshots after them, as ever.
    assert not list((tmp_path / "x/state").glob(f"site-*/*/{2:020d}.delta.*"))


def test_a_damaged_task_file_is_named(tmp_path: Path) -> None:
    job = Job(tmp_path / "t", tmp_path / "tc", "task", 100, 1)
    job.batch(0, [{"a": entry(1)} for _ in TPS])
    (path,) = (tmp_path / "t/state" / DELTAS_DIR).iterdir()
    path.write_bytes(path.read_bytes()[:40])
    shutil.rmtree(tmp_path / "tc")
    with pytest.raises(StorageError, match=r"state file .*\.arrow is damaged"):
        job.state(1)


def test_task_files_on_s3(s3: Any, tmp_path: Path) -> None:
    rng = random.Random(5)
    per_part = Job(tmp_path / "p", tmp_path / "pc", "partition", 2, 0)
    root = s3.new_prefix()
    per_task = Job(root, tmp_path / "tc", "task", 2, 0, s3.storage_options())
    for b in range(8):
        changes = random_changes(rng, b)
        per_part.batch(b, changes)
        per_task.batch(b, changes)
    assert per_task.state(8, tmp_path / "cold") == per_part.state(8)
    left = per_task.checkpoint.task_files().files
    assert 0 < len(left) < 8 and len({f.version for f in left}) == len(left)


def test_partitions_moving_between_tasks(tmp_path: Path) -> None:
    # The tasks' shares change from batch to batch (a new site, other cores): every task
    # file ends up holding partitions of several later tasks; none goes while one needs it.
    rng = random.Random(11)
    per_part = Job(tmp_path / "p", tmp_path / "pc", "partition", 2, 1)
    per_task = Job(tmp_path / "t", tmp_path / "tc", "task", 2, 1)
    for b in range(16):
        changes = random_changes(rng, b)
        per_part.batch(b, changes)
        per_task.batch(b, changes, tasks=[1, 2, 3][b % 3])
        assert per_task.state(b + 1, tmp_path / f"cold-{b}") == per_part.state(b + 1)
    left = per_task.checkpoint.task_files().files
    assert min(f.version for f in left) > 4, [f.version for f in left]


def test_task_files_go_after_a_switch_back_to_a_file_per_partition(tmp_path: Path) -> None:
    after = switch_layouts(tmp_path, "task", "partition", 2, 13)
    assert not after.checkpoint.task_files().files


def test_the_process_cache_holds_only_listed_task_files(tmp_path: Path) -> None:
    # Indexes of task files cleanup had deleted stayed cached until 4,096 of them: memory grew
    # by 0.5 MB a batch at 1,000 topic-partitions over an hour (JVM and workers 1.9 -> 2.6 GB).
    from inorder.state import task_deltas

    job = Job(tmp_path / "t", tmp_path / "tc", "task", interval=2, retain=0)
    rng = random.Random(7)
    directory = str(tmp_path / "t/state" / DELTAS_DIR)
    for b in range(30):
        job.batch(b, random_changes(rng, b), tasks=2)
        listed = {f.path for f in TaskFiles(job.checkpoint.location, directory).files}
        cached = {p for p in task_deltas._CACHE._indexes if p.startswith(directory)}
        assert cached <= listed, sorted(cached - listed)
    assert len(listed) < 30, "cleanup kept every task file: the test shows nothing"
    assert job.state(30) == job.state(30, tmp_path / "cold")


def test_the_index_cache_is_bounded_by_partition_slices(tmp_path: Path) -> None:
    from inorder.state import task_deltas

    job = Job(tmp_path / "t", tmp_path / "tc", "task", interval=50, retain=100)
    for b in range(6):
        job.batch(b, random_changes(random.Random(b), b))
    listed = job.checkpoint.task_files()
    small = task_deltas._Cache(parts=len(TPS) * 2)  # room for two files' indexes
    for f in listed.files:
        assert small.index(listed.location, f.path).version == f.version
    assert len(small._indexes) == 2 and small._index_parts == len(TPS) * 2
