"""State files of one task made durable together: one sync at the end, deletions after it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from inorder.records import TopicPartition
from inorder.state import checkpoint as checkpoint_module
from inorder.state.checkpoint import CheckpointStore
from inorder.storage.group_sync import SYNCFS_FROM, make_durable, write_unsynced

TP = TopicPartition("site-a", 0)


def _table() -> pa.Table:
    return pa.table({"key": ["k"], "deleted": [False]})


def test_files_are_synced_once_at_the_end_and_deletions_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    old = store.file_path(TP, 1, "delta", "a" * 12)
    store.write_table(TP, 1, "delta", _table(), "a" * 12)
    synced: list[list[str]] = []
    real = checkpoint_module.make_durable

    def record(paths: list[str]) -> None:
        synced.append(list(paths))
        real(paths)

    monkeypatch.setattr(checkpoint_module, "make_durable", record)
    with store.durable_together():
        for partition in range(3):
            tp = TopicPartition("site-a", partition)
            store.write_table(tp, 2, "delta", _table(), "b" * 12)
        store.delete(old)
        assert Path(old).exists(), "a deletion inside waits for the sync"
        assert synced == []
    assert len(synced) == 1 and len(synced[0]) == 3
    assert all(Path(p).exists() for p in synced[0])
    assert not Path(old).exists()
    # Outside the block, files are durable on their own and deletions immediate.
    store.write_table(TP, 3, "delta", _table(), "c" * 12)
    assert len(synced) == 1


def test_a_failed_block_syncs_nothing_and_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    store.write_table(TP, 1, "delta", _table(), "a" * 12)
    old = store.file_path(TP, 1, "delta", "a" * 12)
    synced: list[list[str]] = []
    monkeypatch.setattr(checkpoint_module, "make_durable", lambda paths: synced.append(paths))
    with pytest.raises(RuntimeError), store.durable_together():
        store.write_table(TP, 2, "delta", _table(), "b" * 12)
        store.delete(old)
        raise RuntimeError("a partition's commit failed")
    assert synced == []
    assert Path(old).exists()
    store.delete(old)
    assert not Path(old).exists()


def test_the_group_does_not_travel_with_a_pickled_store(tmp_path: Path) -> None:
    import pickle

    store = CheckpointStore(str(tmp_path / "ckpt"))
    with store.durable_together():
        copy = pickle.loads(pickle.dumps(store))
        copy.write_table(TP, 1, "delta", _table(), "a" * 12)
        old = copy.file_path(TP, 1, "delta", "a" * 12)
        copy.delete(old)
        assert not Path(old).exists(), "the copy is not inside the block"


@pytest.mark.parametrize("files", [1, SYNCFS_FROM + 2])
def test_make_durable_by_fsync_and_by_syncfs(tmp_path: Path, files: int) -> None:
    paths = [str(tmp_path / f"d{i % 3}" / f"f{i}.bin") for i in range(files)]
    for i, path in enumerate(paths):
        write_unsynced(path, bytes([i]) * 10)
    make_durable(paths)
    assert [Path(p).read_bytes() for p in paths] == [bytes([i]) * 10 for i in range(files)]
    assert not list(tmp_path.rglob(".tmp-*"))
