"""The versioned state store: deltas, snapshots, idempotent rewrites, cache verification."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.property.procs import Tally

import inorder.state.store as store_module
import inorder.state.store_commit as store_commit_module
from inorder.records import TopicPartition
from inorder.state.checkpoint import CheckpointStore
from inorder.state.codec import StateCodec
from inorder.state.entry import KeyEntry, PartitionMeta
from inorder.state.store import PartitionStore, StateOptions
from inorder.state.store_commit import commit_partitions

TP = TopicPartition("orders", 3)
CODEC = StateCodec(Tally)


def entry(n: int, timer: int | None = None, kind: int = 0) -> KeyEntry:
    return KeyEntry(Tally(n, n * 10, [n]), last_offset=n, timer=timer, timer_kind=kind)


class Harness:
    """Runs 'batches' of changes against a store, like tasks do."""

    def __init__(
        self,
        root: str,
        cache: Path,
        interval: int = 3,
        retain: int = 3,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.checkpoint = CheckpointStore(root, storage_options)
        # A file per partition (format 2): what these tests look at; task files are
        # tests/integration/test_task_deltas.py's, against this layout.
        self.options = StateOptions(
            snapshot_interval=interval,
            retain_versions=retain,
            cache_dir=str(cache),
            delta_files="partition",
        )

    def store(self) -> PartitionStore:
        return PartitionStore(self.checkpoint, TP, CODEC, "epoch-1", self.options)

    def batch(
        self, batch_id: int, changes: dict[str, KeyEntry | None], last: int
    ) -> PartitionStore:
        with self.store() as store:
            store.open(batch_id)
            commit_partitions([(store, changes, PartitionMeta(last, None))])
            return store

    def state(self, batch_id: int) -> tuple[dict[str, Any], PartitionMeta, PartitionStore]:
        with self.store() as store:
            view, meta = store.open(batch_id)
            found = {}
            for key in ("a", "b", "c", "d"):
                e = view.load(key)
                if e is not None:
                    found[key] = (e.state, e.last_offset, e.timer)
            return found, meta, store


def files(work: Path) -> list[tuple[int, str]]:
    """The state files of the test partition as (version, kind), each named by its attempt."""
    names = sorted(p.name for p in (work / "ckpt/state/orders/3").iterdir())
    assert all(
        re.fullmatch(r"\d{20}\.(delta|snapshot)\.[0-9a-f]{12}\.arrow\.zstd", n) for n in names
    )
    return [(int(n.split(".")[0]), n.split(".")[1]) for n in names]


def test_versions_deltas_and_snapshot(tmp_path: Path) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    h.batch(0, {"a": entry(1), "b": entry(2)}, 10)
    h.batch(1, {"a": entry(3), "c": entry(4, timer=99)}, 20)
    h.batch(2, {"b": None}, 30)  # third delta: a snapshot too
    h.batch(3, {"d": entry(5)}, 40)
    assert files(tmp_path) == [
        (0, "delta"),
        (1, "delta"),
        (2, "delta"),
        (2, "snapshot"),
        (3, "delta"),
    ]
    found, meta, store = h.state(4)
    assert store.stats.cache_hit
    assert meta.last_offset == 40
    assert found == {
        "a": (Tally(3, 30, [3]), 3, None),
        "c": (Tally(4, 40, [4]), 4, 99),
        "d": (Tally(5, 50, [5]), 5, None),
    }
    # The state as of an earlier version is still loadable (rebuild, not the cache).
    found2, meta2, store2 = h.state(2)
    assert not store2.stats.cache_hit
    assert set(found2) == {"a", "b", "c"} and meta2.last_offset == 20


def test_cold_cache_rebuilds_from_snapshot_and_deltas(tmp_path: Path) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    for b in range(7):
        h.batch(b, {f"{'abcd'[b % 4]}": entry(b, timer=1000 - b)}, b)
    warm, _, _ = h.state(7)
    cold = Harness(str(tmp_path / "ckpt"), tmp_path / "other-cache")
    found, meta, store = cold.state(7)
    assert not store.stats.cache_hit and store.stats.rebuilt_keys > 0
    assert found == warm and meta.last_offset == 6
    with cold.store() as s:
        s.open(7)
        assert s.key_count() == 4
        view, _ = s.open(7)
        assert view.timers_after(0, None, 10) == [(994, "c"), (995, "b"), (996, "a"), (997, "d")]
        assert view.timers_after(0, (995, "b"), 10) == [(996, "a"), (997, "d")]


def test_rerun_of_a_batch_is_idempotent_and_ignores_its_stale_version(tmp_path: Path) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=100)
    h.batch(0, {"a": entry(1)}, 1)
    h.batch(1, {"a": entry(2), "b": entry(7)}, 2)  # attempt 1 of batch 1 (never committed)
    (first,) = (tmp_path / "ckpt/state/orders/3").glob(f"{1:020d}.delta.*.arrow.zstd")
    content = h.checkpoint.read_table(str(first))
    # Re-run of batch 1: must see version 0 (not its own stale version 1, nor the cache at 1).
    found, _, store = h.state(1)
    assert not store.stats.cache_hit
    assert found == {"a": (Tally(1, 10, [1]), 1, None)}
    h.batch(1, {"a": entry(2), "b": entry(7)}, 2)
    (again,) = (tmp_path / "ckpt/state/orders/3").glob(f"{1:020d}.delta.*.arrow.zstd")
    assert again != first and h.checkpoint.read_table(str(again)) == content  # same rows
    found, _, store = h.state(2)
    assert store.stats.cache_hit and set(found) == {"a", "b"}


def test_a_cache_left_by_an_uncommitted_attempt_is_not_used_after_a_rerun(
    tmp_path: Path,
) -> None:
    # Batch 1 runs in one worker's cache and its commit fails; the batch is re-run, with
    # other settings, in another worker's cache and commits. The first cache claims version 1
    # too, with the first attempt's content: batch 2 in that worker must not trust it.
    first = Harness(str(tmp_path / "ckpt"), tmp_path / "cache-1", interval=100)
    second = Harness(str(tmp_path / "ckpt"), tmp_path / "cache-2", interval=100)
    first.batch(0, {"a": entry(1)}, 1)
    first.batch(1, {"a": entry(2)}, 2)  # the attempt whose commit failed
    second.batch(1, {"b": entry(9)}, 2)  # the re-run that committed
    found, _, store = first.state(2)
    assert not store.stats.cache_hit
    assert found == {"a": (Tally(1, 10, [1]), 1, None), "b": (Tally(9, 90, [9]), 9, None)}


def test_versions_of_uncommitted_later_batches_are_deleted(tmp_path: Path) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=100)
    for b in range(4):
        h.batch(b, {"a": entry(b)}, b)
    found, _, _ = h.state(2)  # as if batches 2 and 3 never committed
    assert found["a"][0] == Tally(1, 10, [1])
    assert files(tmp_path) == [(0, "delta"), (1, "delta")]  # this attempt writes its own 2


def test_cache_of_another_epoch_is_not_trusted(tmp_path: Path) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    h.batch(0, {"a": entry(1)}, 1)
    # A new checkpoint at the same path (epoch changes), same version numbers.
    other = PartitionStore(h.checkpoint, TP, CODEC, "epoch-2", h.options)
    with other:
        view, _ = other.open(1)
        assert not other.stats.cache_hit
        assert view.load("a") is not None


def test_old_versions_are_cleaned_after_snapshots(tmp_path: Path) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=2, retain=1)
    for b in range(8):
        h.batch(b, {"a": entry(b)}, b)
    versions = sorted({int(p.name[:20]) for p in (tmp_path / "ckpt/state/orders/3").iterdir()})
    assert versions[0] >= 4  # snapshots at 1, 3, 5, 7; keep from 7 - 1
    found, _, _ = Harness(str(tmp_path / "ckpt"), tmp_path / "cold").state(8)
    assert found["a"][0] == Tally(7, 70, [7])


@pytest.mark.parametrize(("interval", "retain"), [(2, 0), (2, 1), (3, 1), (3, 5)])
def test_every_batch_can_be_rerun_after_its_snapshot_and_cleanup(
    tmp_path: Path, interval: int, retain: int
) -> None:
    # A batch whose tasks committed state (a snapshot, old versions deleted) may still fail
    # to commit (the sink, the driver): its re-run must see the state before it, whole.
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=interval, retain=retain)
    model: dict[str, Any] = {}
    for b in range(9):
        key = "abcd"[b % 4] if b else "a"
        cold = Harness(h.checkpoint.root, tmp_path / f"cold-{b}", interval=interval)
        h.batch(b, {key: entry(b)}, b)
        found, meta, _ = cold.state(b)  # the re-run of b, in another worker
        assert found == model and meta.last_offset == b - 1, b
        h.batch(b, {key: entry(b)}, b)  # which commits
        model[key] = (Tally(b, b * 10, [b]), b, None)


def test_a_first_snapshot_late_in_its_spread_keeps_the_first_deltas(tmp_path: Path) -> None:
    # Defaults: 20 and 20, and this partition's first snapshot comes after more than 20
    # deltas (snapshot_after): the batch writing it must leave delta 0 for its re-run.
    first = store_module.snapshot_after(TP, 20)
    assert first > 21
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=20, retain=20)
    for b in range(first):
        h.batch(b, {"a": entry(b)} if b == 0 else {"b": entry(b)}, b)
    assert (first - 1, "snapshot") in files(tmp_path)
    found, _, _ = Harness(h.checkpoint.root, tmp_path / "cold").state(first - 1)
    assert found == {
        "a": (Tally(0, 0, [0]), 0, None),
        "b": (Tally(first - 2, (first - 2) * 10, [first - 2]), first - 2, None),
    }


def test_busy_cache_falls_back_to_a_private_one(tmp_path: Path) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    h.batch(0, {"a": entry(1)}, 1)
    with h.store() as holder:
        holder.open(1)
        found, _, store = h.state(1)  # a concurrent attempt of the same task
        assert not store.stats.cache_hit and found["a"][0] == Tally(1, 10, [1])
        assert store.stats.opened_db and not store.stats.reused_handle  # a private one
        assert holder._cache is not None and holder._cache.get("a") is not None
    found, _, store = h.state(1)  # the shared view again, untouched by the private one
    assert store.stats.cache_hit and store.stats.reused_handle and not store.stats.opened_db


def test_store_on_s3(s3: Any, tmp_path: Path) -> None:
    h = Harness(
        s3.new_prefix(), tmp_path / "cache", interval=2, storage_options=s3.storage_options()
    )
    for b in range(3):
        h.batch(b, {"a": entry(b), "b": entry(b + 10)}, b)
    found, meta, _ = Harness(
        h.checkpoint.root, tmp_path / "cold", interval=2, storage_options=s3.storage_options()
    ).state(3)
    assert found["a"][0] == Tally(2, 20, [2]) and meta.last_offset == 2


@pytest.mark.parametrize("ts", [None, -5, 2**62])
def test_timer_index_orders_any_deadline(tmp_path: Path, ts: int | None) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    h.batch(0, {"a": entry(1, timer=ts, kind=1), "b": entry(2, timer=0, kind=1)}, 1)
    with h.store() as s:
        view, _ = s.open(1)
        expected = sorted([(0, "b")] + ([] if ts is None else [(ts, "a")]))
        assert view.timers_after(1, None, 10) == expected
        assert view.timers_after(0, None, 10) == []


# -- caches kept open between batches ----------------------------------------------------------

_OTHER_PROCESS = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.integration.test_state_store import Harness, entry
from inorder.state.entry import PartitionMeta
from inorder.state.store_commit import commit_partitions
h = Harness(sys.argv[2], __import__("pathlib").Path(sys.argv[3]))
mode, batch = sys.argv[4], int(sys.argv[5])
store = h.store()
store.open(batch)
if mode == "commit":
    commit_partitions([(store, {"b": entry(batch)}, PartitionMeta(batch * 10, None))])
    store.close()
    print("slot", store.stats.cache_hit, store.stats.caught_up, flush=True)
else:  # hold the cache open until killed
    print("holding", flush=True)
    time.sleep(600)
"""


def _other_process(h: Harness, cache: Path, mode: str, batch: int) -> Any:
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    args = [sys.executable, "-c", _OTHER_PROCESS, root, h.checkpoint.root, str(cache), mode]
    return subprocess.Popen([*args, str(batch)], stdout=subprocess.PIPE, text=True, cwd=root)


def test_cache_stays_open_in_the_process_between_batches(tmp_path: Path) -> None:
    from inorder.state.registry import REGISTRY

    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    first = h.batch(0, {"a": entry(1)}, 1)
    assert not first.stats.reused_handle
    assert [p for p in REGISTRY.held_paths() if p.startswith(str(tmp_path / "cache"))] == [
        str(next((tmp_path / "cache").glob("*/proc@0")))
    ]
    second = h.batch(1, {"b": entry(2)}, 2)
    assert not second.stats.opened_db
    assert second.stats.reused_handle and second.stats.cache_hit
    found, meta, store = h.state(2)
    assert store.stats.reused_handle and store.stats.cache_hit
    assert set(found) == {"a", "b"} and meta.last_offset == 2
    # keep_open=0: closed after each task, nothing held.
    closing = Harness(str(tmp_path / "ckpt2"), tmp_path / "cache2")
    closing.options = StateOptions(cache_dir=str(tmp_path / "cache2"), keep_open=0)
    assert closing.batch(0, {"a": entry(1)}, 1).stats.opened_db
    assert not any(p.startswith(str(tmp_path / "cache2")) for p in REGISTRY.held_paths())
    again = closing.state(1)[2]
    assert again.stats.cache_hit and again.stats.opened_db  # the cache on disk is still current


def test_partitions_share_one_database_per_process(tmp_path: Path) -> None:
    from inorder.state.registry import REGISTRY

    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    other_tp = TopicPartition("orders", 31)  # its prefix sorts right after orders-3's

    def other_batch(batch_id: int, changes: dict[str, KeyEntry | None]) -> PartitionStore:
        with PartitionStore(h.checkpoint, other_tp, CODEC, "epoch-1", h.options) as store:
            store.open(batch_id)
            commit_partitions([(store, changes, PartitionMeta(batch_id, None))])
            return store

    assert h.batch(0, {"a": entry(1, timer=5)}, 1).stats.opened_db
    first = other_batch(0, {"a": entry(7, timer=3)})
    assert not first.stats.opened_db and not first.stats.reused_handle
    assert [p.name for p in (tmp_path / "cache").glob("*/*") if p.is_dir()] == ["proc@0"]
    found, _, store = h.state(1)
    assert store.stats.cache_hit and store.stats.reused_handle and not store.stats.opened_db
    assert found == {"a": (Tally(1, 10, [1]), 1, 5)}
    again = other_batch(1, {"b": entry(8)})
    assert again.stats.cache_hit and again.stats.reused_handle and not again.stats.opened_db
    with PartitionStore(h.checkpoint, other_tp, CODEC, "epoch-1", h.options) as store:
        view, _ = store.open(2)
        assert store.key_count() == 2 and view.timers_after(0, None, 10) == [(3, "a")]
    mine = [p for p in REGISTRY.held_paths() if p.startswith(str(tmp_path / "cache"))]
    assert len(mine) == 1


def test_views_of_one_database_do_not_see_each_other(tmp_path: Path) -> None:
    from inorder.state.cache import CacheDB, entry_row, partition_prefix

    db = CacheDB(str(tmp_path / "db"))
    try:
        # orders-1's keys sort right before orders-10's (\x00 < "0"), the closest neighbours.
        one, ten = db.view(partition_prefix("orders", 1)), db.view(partition_prefix("orders", 10))
        rows = {k: entry_row(entry(n, timer=n, kind=n % 2), None) for n, k in enumerate("abcd")}
        one.write([(k, rows[k]) for k in "ab"], [], {"epoch": "e", "version": 1, "meta": {}})
        ten.write([(k, rows[k]) for k in "bcd"], [], {"epoch": "e", "version": 4, "meta": {}})
        assert [k for k, _ in one.rows()] == ["a", "b"] and one.header()["keys"] == 2
        assert one.timers_after(0, None, 10) == [(0, "a")]
        assert one.timers_after(1, None, 10) == [(1, "b")]
        assert one.timers_after(1, (1, "b"), 10) == []  # ten's kind-1 timers follow
        assert ten.timers_after(0, None, 10) == [(2, "c")]
        assert one.get("c") is None and ten.get("a") is None
        one.clear()
        assert list(one.rows()) == [] and one.header()["version"] == -1
        assert one.timers_after(0, None, 10) == [] and one.timers_after(1, None, 10) == []
        assert [k for k, _ in ten.rows()] == ["b", "c", "d"]
        assert ten.header()["version"] == 4 and ten.header()["keys"] == 3
        assert ten.timers_after(1, None, 10) == [(1, "b"), (3, "d")]
        ten.clear()
        assert list(db.db.keys()) == []
    finally:
        db.close()


def test_slot_directories_of_an_earlier_release_are_removed_unless_held(tmp_path: Path) -> None:
    import fcntl
    import os

    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache")
    base = Path(h.store()._cache_base())
    for old in ("orders-3", "orders-3@1", "proc-0"):
        (base / old).mkdir(parents=True)
        (base / old / "CURRENT").write_text("x")
        (base / f"{old}.lock").touch()
    fd = os.open(base / "orders-3@1.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a process of the earlier release
        h.batch(0, {"a": entry(1)}, 1)
        names = sorted(p.name for p in base.iterdir())
        assert names == ["orders-3@1", "orders-3@1.lock", "proc@0", "proc@0.lock"]
    finally:
        os.close(fd)


def test_partition_moving_to_another_process_and_back_catches_up(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    h = Harness(str(tmp_path / "ckpt"), cache, interval=100)
    h.batch(0, {"a": entry(1)}, 1)
    h.batch(1, {"a": entry(2)}, 2)
    # Batch 2 runs in another worker process: this one holds slot 0, so it takes slot 1,
    # where this partition never ran: rebuilt.
    proc = _other_process(h, cache, "commit", 2)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == "slot False 0"
    assert sorted(p.name for p in cache.glob("*/*") if p.is_dir()) == ["proc@0", "proc@1"]
    # Back here for batch 3: this process's handle is at version 1 and applies delta 2 only.
    found, meta, store = h.state(3)
    assert store.stats.reused_handle and not store.stats.cache_hit
    assert store.stats.caught_up == 1
    assert found == {"a": (Tally(2, 20, [2]), 2, None), "b": (Tally(2, 20, [2]), 2, None)}
    assert meta.last_offset == 20
    h.batch(3, {"c": entry(3)}, 30)
    found, _, store = h.state(4)
    assert store.stats.cache_hit and set(found) == {"a", "b", "c"}
    # Batch 4 in another process again: slot 1 holds version 2 and applies delta 3 only.
    proc = _other_process(h, cache, "commit", 4)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == "slot False 1"
    found, _, store = h.state(5)
    assert store.stats.caught_up == 1 and set(found) == {"a", "b", "c"}


def test_kept_cache_whose_version_was_cleaned_up_is_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    h = Harness(str(tmp_path / "ckpt"), cache, interval=2, retain=0)
    h.batch(0, {"a": entry(0)}, 0)  # this process's cache: version 0
    # Other caches advance the checkpoint far enough that version 0 is deleted.
    for b in range(1, 6):
        Harness(h.checkpoint.root, tmp_path / f"elsewhere-{b}", interval=2, retain=0).batch(
            b, {"a": entry(b)}, b
        )
    assert not list((tmp_path / "ckpt/state/orders/3").glob(f"{0:020d}.*"))
    found, meta, store = h.state(6)
    assert store.stats.reused_handle and not store.stats.cache_hit
    assert store.stats.caught_up == 0 and store.stats.rebuilt_keys > 0
    assert found["a"][0] == Tally(5, 50, [5]) and meta.last_offset == 5


def test_cache_of_a_killed_process_is_reused(tmp_path: Path) -> None:
    import signal

    from inorder.state.registry import REGISTRY

    cache = tmp_path / "cache"
    h = Harness(str(tmp_path / "ckpt"), cache)
    h.batch(0, {"a": entry(1)}, 1)
    REGISTRY.close_all()  # as if this process had ended: the slot is free
    proc = _other_process(h, cache, "hold", 1)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        busy, _, store = h.state(1)  # slot 0 is locked by the other process
        assert store.stats.cache_hit is False and busy["a"][0] == Tally(1, 10, [1])
    finally:  # never left holding (it sleeps until killed)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    REGISTRY.close_all()
    found, _, store = h.state(1)  # the kernel released the dead process's locks
    assert store.stats.cache_hit and found["a"][0] == Tally(1, 10, [1])
    assert any(p.endswith("/proc@0") and p.startswith(str(cache)) for p in REGISTRY.held_paths())


def test_cache_directory_removed_under_an_open_handle_is_not_trusted(tmp_path: Path) -> None:
    import shutil

    cache = tmp_path / "cache"
    h = Harness(str(tmp_path / "ckpt"), cache)
    h.batch(0, {"a": entry(1)}, 1)
    shutil.rmtree(cache)  # e.g. the temp directory cleaned while the worker lives
    found, _, store = h.state(1)
    assert not store.stats.reused_handle and not store.stats.cache_hit
    assert found["a"][0] == Tally(1, 10, [1])
    assert [p.name for p in cache.glob("*/*") if p.is_dir()] == ["proc@0"]


def test_handle_of_a_removed_slot_leaves_its_successor_alone(tmp_path: Path) -> None:
    """Closing a database whose directory was removed must not touch the database another
    process created at the same place since: RocksDB's close deletes, by path, every file of
    its directory it does not know."""
    from inorder.state.registry import REGISTRY

    cache = tmp_path / "cache"
    h = Harness(str(tmp_path / "ckpt"), cache)
    h.batch(0, {"a": entry(1)}, 1)  # this process holds the slot open
    shutil.rmtree(cache)  # the directory is cleaned while the worker lives
    proc = _other_process(h, cache, "commit", 1)  # another worker makes the slot anew
    assert proc.stdout is not None and proc.stdout.readline().split()[0] == "slot"
    assert proc.wait(60) == 0
    found, _, store = h.state(2)  # drops the stale handle, then opens the other's database
    assert store.stats.cache_hit and not store.stats.reused_handle
    assert found["b"][0] == entry(1).state
    REGISTRY.close_all()


def test_slot_of_an_earlier_release_is_made_anew(tmp_path: Path) -> None:
    """Earlier releases kept the database files in the slot directory itself."""
    from inorder.state.registry import REGISTRY

    cache = tmp_path / "cache"
    h = Harness(str(tmp_path / "ckpt"), cache)
    h.batch(0, {"a": entry(1)}, 1)
    REGISTRY.close_all()
    slot = next(cache.glob("*/proc@0"))
    (database,) = slot.iterdir()
    for f in database.iterdir():  # the layout of earlier releases
        f.rename(slot / f.name)
    database.rmdir()
    found, _, store = h.state(1)
    assert not store.stats.cache_hit and found["a"][0] == Tally(1, 10, [1])
    assert [p.name[:3] for p in slot.iterdir()] == ["db-"]
    REGISTRY.close_all()


def test_failed_load_forgets_the_view_not_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=100)
    h.batch(0, {"a": entry(1)}, 1)
    Harness(h.checkpoint.root, tmp_path / "elsewhere", interval=100).batch(1, {"b": entry(2)}, 2)

    def fail(*args: object) -> None:
        raise OSError("checkpoint unreachable")

    monkeypatch.setattr(PartitionStore, "_catch_up", fail)
    with pytest.raises(OSError), h.store() as store:
        store.open(2)
    monkeypatch.undo()
    found, _, store = h.state(2)
    assert not store.stats.reused_handle and not store.stats.opened_db
    assert store.stats.caught_up == 1 and set(found) == {"a", "b"}


@pytest.mark.parametrize("table_rows", [16_384, 2])
def test_partitions_committed_together_read_back_as_committed_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_rows: int
) -> None:
    """A task commits its partitions' deltas together (one table, a slice per file; several
    tables when the rows exceed a table's): each file holds exactly its partition's rows and
    metadata, read back through the cache and through a rebuild from the files alone."""
    monkeypatch.setattr(store_commit_module, "TABLE_ROWS", table_rows)
    checkpoint = CheckpointStore(str(tmp_path / "ckpt"))
    options = StateOptions(snapshot_interval=2, retain_versions=2, cache_dir=str(tmp_path / "c"))
    tps = [TopicPartition(f"site-{i}", i % 2) for i in range(5)]
    changes: list[dict[str, KeyEntry | None]] = [
        {"a": entry(1), "b": entry(2, timer=7)},
        {},  # a partition whose batch changed no key still writes its (empty) delta
        {"a": None, "c": entry(3)},
        {"d": entry(4, timer=9, kind=1)},
        {"a": entry(5), "b": None, "c": None, "d": entry(6)},
    ]
    for batch_id in range(3):
        stores = [PartitionStore(checkpoint, tp, CODEC, "epoch-1", options) for tp in tps]
        opened = [store.open(batch_id) for store in stores]
        commit_partitions(
            [
                (store, changes[(i + batch_id) % 5], PartitionMeta(100 * batch_id + i, None))
                for i, (store, _) in enumerate(zip(stores, opened, strict=True))
            ]
        )
        for store in stores:
            store.close()

    def seen(store: PartitionStore) -> tuple[dict[str, Any], int | None]:
        view, meta = store.open(3)
        loaded = {}
        for key in "abcd":
            e = view.load(key)
            if e is not None:
                loaded[key] = (e.state, e.last_offset, e.timer, e.timer_kind)
        # The count kept beside the keys (carried from the open into each commit) is exact.
        assert store.key_count() == len(loaded), (store.tp, loaded)
        store.close()
        return loaded, meta.last_offset

    expected = []
    for i, tp in enumerate(tps):
        alone = Harness(str(tmp_path / f"alone-{i}"), tmp_path / f"alone-cache-{i}", 2, 2)
        for batch_id in range(3):
            with PartitionStore(alone.checkpoint, TP, CODEC, "epoch-1", alone.options) as store:
                store.open(batch_id)
                commit_partitions(
                    [(store, changes[(i + batch_id) % 5], PartitionMeta(100 * batch_id + i, None))]
                )
        with PartitionStore(alone.checkpoint, TP, CODEC, "epoch-1", alone.options) as store:
            expected.append(seen(store))
        together = PartitionStore(checkpoint, tp, CODEC, "epoch-1", options)
        assert seen(together) == expected[i] and expected[i][1] == 200 + i
    shutil.rmtree(tmp_path / "c")  # from the files alone
    for i, tp in enumerate(tps):
        store = PartitionStore(checkpoint, tp, CODEC, "epoch-1", options)
        assert seen(store) == expected[i]
        assert not store.stats.cache_hit
