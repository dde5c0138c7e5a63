"""State format 2 (Arrow IPC files) over a checkpoint of format 1 (Parquet files).

The format 1 files are written with format 1's encoding and names (Parquet, zstd, no
statistics or dictionaries, ``.parquet``), as the releases before format 2 wrote them; the
batches after them run with today's code. The state at every version must be exactly what a
checkpoint written in format 2 throughout holds, through the warm cache, a cold rebuild and
the tools' read-only loader; snapshots and cleanup go by version whatever a file's encoding.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.integration.test_state_store import TP, Harness
from tests.property.procs import Tally

from inorder.checkpoint.state_files import load_partition_state, loadable_versions
from inorder.errors import StorageError
from inorder.state import checkpoint as checkpoint_module
from inorder.state.checkpoint import CheckpointStore
from inorder.state.entry import KeyEntry


def entry(n: int, timer: int | None = None, kind: int = 0, ignored: bool = False) -> KeyEntry:
    """An entry with every stored field set (an ignored key has no state)."""
    state = None if ignored else Tally(n, n * 10, [n])
    return KeyEntry(state, n, 1_700_000_000_000_000 + n, f"k{n}".encode(), n, timer, kind, ignored)


#: Batch ``b`` changes these keys (``None``: deleted); timers so that the index is compared too.
CHANGES: list[dict[str, KeyEntry | None]] = [
    {"a": entry(1), "b": entry(2, timer=500)},
    {"a": entry(3), "c": entry(4, timer=99, kind=1)},
    {"b": None},
    {"d": entry(5)},
    {"a": None, "e": entry(6, timer=700)},
    {"c": entry(7)},
    {"f": entry(8), "d": None},
    {"a": entry(9, timer=1)},
    {"g": entry(10, ignored=True)},
    {"e": None},
]


def _format1_bytes(table: pa.Table) -> bytes:
    """A state table encoded as format 1 wrote it."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", write_statistics=False, use_dictionary=False)
    return buffer.getvalue()


@contextmanager
def format1(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """State files written inside are format 1's (Parquet, ``.parquet``)."""
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_module, "encode_state_file", _format1_bytes)
        real = CheckpointStore.file_path

        def parquet_path(self: CheckpointStore, *args: object) -> str:
            path: str = real(self, *args)  # type: ignore[arg-type]
            return path.removesuffix(".arrow.zstd") + ".parquet"

        patch.setattr(CheckpointStore, "file_path", parquet_path)
        yield


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "state/orders/3").iterdir())


def _all_states(store: CheckpointStore, upto: int) -> dict[int, tuple[object, object]]:
    """Every loadable version up to ``upto``: its entries and meta (the tools' loader)."""
    out: dict[int, tuple[object, object]] = {}
    for v in loadable_versions(store.versions(TP)):
        if v <= upto:
            state = load_partition_state(store, TP, v)
            out[v] = (state.entries, state.meta)
    return out


def _state(h: Harness, batch_id: int) -> tuple[dict[str, tuple[object, ...]], object, bool]:
    """Every key's entry (all its fields) before ``batch_id`` through the store (its cache or
    a rebuild), the partition's meta, and whether the cache was current."""
    with h.store() as store:
        view, meta = store.open(batch_id)
        found = {
            k: tuple(getattr(e, f) for f in KeyEntry.__slots__)
            for k in "abcdefg"
            if (e := view.load(k)) is not None
        }
        return found, meta, store.stats.cache_hit


def test_a_format_1_partition_continues_in_format_2_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = Harness(str(tmp_path / "ref"), tmp_path / "ref-cache", interval=3, retain=2)
    mixed = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=3, retain=2)
    for b, changes in enumerate(CHANGES):
        reference.batch(b, changes, b * 10)
        if b < 5:  # batches 0-4 by format 1: deltas 0-4, a snapshot at 2
            with format1(monkeypatch):
                mixed.batch(b, changes, b * 10)
        else:
            mixed.batch(b, changes, b * 10)
        if b == 5:
            names = _names(tmp_path / "ckpt")
            assert {n.rsplit(".", 1)[1] for n in names} == {"parquet", "zstd"}, names
            # The tools read the mixed chain (Parquet snapshot 2, deltas 3-4, IPC delta 5).
            assert _all_states(mixed.checkpoint, 5) == _all_states(reference.checkpoint, 5)
            cold = Harness(str(tmp_path / "ckpt"), tmp_path / "cold-5", interval=3, retain=2)
            want = _state(reference, 6)
            assert _state(cold, 6)[:2] == want[:2]
    # Batch 5 was the third delta after snapshot 2: its snapshot, and from then on everything
    # this release writes, is an IPC file; cleanup went by version, Parquet files included.
    names = _names(tmp_path / "ckpt")
    assert all(n.endswith(".arrow.zstd") for n in names), names
    assert [n.split(".")[:2] for n in names] == [n.split(".")[:2] for n in _names(tmp_path / "ref")]
    last = len(CHANGES)
    assert _all_states(mixed.checkpoint, last) == _all_states(reference.checkpoint, last)
    warm = _state(mixed, last)
    assert warm[2], "the cache followed the checkpoint across the encodings"
    cold = Harness(str(tmp_path / "ckpt"), tmp_path / "cold", interval=3, retain=2)
    assert warm[:2] == _state(reference, last)[:2] == _state(cold, last)[:2]


def test_a_cache_of_a_parquet_version_catches_up_with_ipc_deltas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=100)
    with format1(monkeypatch):
        for b in range(2):
            h.batch(b, CHANGES[b], b)
    # The cache holds version 1 (a Parquet delta); batches 2-3 run elsewhere, in format 2.
    elsewhere = Harness(str(tmp_path / "ckpt"), tmp_path / "elsewhere", interval=100)
    for b in range(2, 4):
        elsewhere.batch(b, CHANGES[b], b)
    with h.store() as store:
        view, meta = store.open(4)
        assert store.stats.caught_up == 2 and not store.stats.cache_hit
        d = view.load("d")
        assert view.load("b") is None and d is not None and d.state == Tally(5, 50, [5])
        assert meta.last_offset == 3


@pytest.mark.parametrize("how", ["truncated", "garbage", "parquet bytes"])
def test_a_damaged_ipc_state_file_is_a_named_error(tmp_path: Path, how: str) -> None:
    h = Harness(str(tmp_path / "ckpt"), tmp_path / "cache", interval=100)
    h.batch(0, CHANGES[0], 0)
    (path,) = (tmp_path / "ckpt/state/orders/3").glob("*.arrow.zstd")
    data = path.read_bytes()
    if how == "truncated":
        damaged = data[: len(data) // 2]
    elif how == "garbage":
        damaged = b"\x00garbage\xff" * 8
    else:  # a file of the other encoding under an IPC name
        damaged = _format1_bytes(h.checkpoint.read_table(str(path)))
    path.write_bytes(damaged)
    cold = Harness(str(tmp_path / "ckpt"), tmp_path / "cold", interval=100)
    with pytest.raises(StorageError, match="is damaged") as caught:
        _state(cold, 1)
    assert str(path) in str(caught.value)
