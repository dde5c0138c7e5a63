"""Reading one topic-partition's checkpointed state at a chosen version, read-only.

The engine's :class:`~inorder.state.store.PartitionStore` goes through a local cache and may
delete files of uncommitted attempts; the tools must not touch a live pipeline's files, so
they read the version files directly: the newest snapshot at or below the version, then every
delta after it up to the version (see :mod:`inorder.state.checkpoint` for the layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inorder.errors import InorderError
from inorder.records import TopicPartition
from inorder.state.checkpoint import STATE_FILE_SCHEMA, CheckpointStore, VersionFile, file_meta
from inorder.state.entry import KeyEntry, PartitionMeta


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """A key's stored row: its state still encoded."""

    state: bytes | None
    last_offset: int
    last_ts: int | None
    kafka_key: bytes | None
    seq: int | None
    timer: int | None
    timer_kind: int
    ignored: bool

    def to_entry(self, decode: Any) -> KeyEntry:
        """A :class:`KeyEntry` with the state decoded by ``decode``."""
        state = None if self.state is None else decode(self.state)
        return KeyEntry(
            state,
            self.last_offset,
            self.last_ts,
            self.kafka_key,
            self.seq,
            self.timer,
            self.timer_kind,
            self.ignored,
        )


@dataclass
class PartitionState:
    """All keys of a topic-partition at one version."""

    tp: TopicPartition
    version: int
    meta: PartitionMeta
    entries: dict[str, StoredEntry]

    @property
    def state_bytes(self) -> int:
        """Encoded size of all states."""
        return sum(len(e.state or b"") for e in self.entries.values())

    def decoded(self, decode: Any) -> dict[str, KeyEntry]:
        """Every entry with its state decoded."""
        return {k: e.to_entry(decode) for k, e in self.entries.items()}


def loadable_versions(files: list[VersionFile]) -> list[int]:
    """Versions whose full state can be rebuilt from the files present.

    A version is loadable from the newest snapshot at or below it plus contiguous deltas
    (every batch writes a delta for every known partition), or, when no snapshot was ever
    written (so nothing was ever cleaned up), from all deltas since the first.
    """
    deltas = sorted({f.version for f in files if f.kind == "delta"})
    snapshots = sorted({f.version for f in files if f.kind == "snapshot"})
    present = set(deltas)
    out: list[int] = []
    for version in sorted(present | set(snapshots)):
        base = max((s for s in snapshots if s <= version), default=None)
        if base is None:
            if snapshots:
                continue  # older files may have been cleaned up after the first snapshot
            out.append(version)
            continue
        if all(v in present for v in range(base + 1, version + 1)):
            out.append(version)
    return out


def _rows(
    store: CheckpointStore, file: VersionFile
) -> tuple[dict[str, StoredEntry], list[str], dict[str, Any]]:
    table = store.read_version(file)
    cols = {n: table.column(n).to_pylist() for n in STATE_FILE_SCHEMA.names}
    upserts: dict[str, StoredEntry] = {}
    deletes: list[str] = []
    for i, key in enumerate(cols["key"]):
        if cols["deleted"][i]:
            deletes.append(key)
            continue
        upserts[key] = StoredEntry(
            cols["state"][i],
            int(cols["last_offset"][i] if cols["last_offset"][i] is not None else -1),
            cols["last_ts"][i],
            cols["kafka_key"][i],
            cols["seq"][i],
            cols["timer"][i],
            int(cols["timer_kind"][i] or 0),
            bool(cols["ignored"][i]),
        )
    return upserts, deletes, file_meta(table)


def load_partition_state(
    store: CheckpointStore, tp: TopicPartition, version: int
) -> PartitionState:
    """The state of ``tp`` after batch ``version``; :class:`InorderError` if not loadable."""
    files = store.versions(tp)
    if version not in loadable_versions(files):
        have = loadable_versions(files)
        hint = f"loadable: {have[0]}..{have[-1]}" if have else "no state files"
        raise InorderError(
            f"state of {tp} at version {version} cannot be rebuilt from the checkpoint ({hint})"
        )
    snapshots = [f for f in files if f.kind == "snapshot" and f.version <= version]
    base = snapshots[-1] if snapshots else None
    chain = ([base] if base else []) + [
        f
        for f in files
        if f.kind == "delta" and f.version <= version and (base is None or f.version > base.version)
    ]
    entries: dict[str, StoredEntry] = {}
    meta_json: dict[str, Any] = {}
    for f in chain:
        upserts, deletes, meta = _rows(store, f)
        entries.update(upserts)
        for key in deletes:
            entries.pop(key, None)
        meta_json = meta.get("meta", meta_json)
    return PartitionState(tp, version, PartitionMeta.from_json(meta_json), entries)


def state_partitions(store: CheckpointStore) -> list[TopicPartition]:
    """Topic-partitions with state files in the checkpoint."""
    from inorder.storage.fs import list_files

    root = store.path("state").rstrip("/")
    found: set[TopicPartition] = set()
    for info in list_files(store.location, root, recursive=True):
        rel = info.path[len(root) :].strip("/").split("/")
        if len(rel) == 3 and rel[1].isdigit():
            found.add(TopicPartition(rel[0], int(rel[1])))
    return sorted(found)
