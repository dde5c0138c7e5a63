"""The commit log of a Parquet dataset written by :class:`~inorder.sinks.parquet.ParquetSink`.

Everything about the dataset's layout and its ``_inorder/`` folder that the sink, compaction
(:mod:`inorder.sinks.compaction`), commit checkpoints (:mod:`inorder.sinks.commit_checkpoint`)
and output repair share: names (staged, final, manifests, checkpoints), reading manifests and
checkpoints, the committed state (:func:`load_state`) and finishing a manifest's publication
(:func:`complete_manifest`). The protocol is described in :mod:`inorder.sinks.parquet` and
``docs/sinks.md``. Kept apart from the sink so that compaction and commit checkpoints, which
the sink runs after a commit, need nothing from the sink module.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from inorder.sinks.base import SinkError
from inorder.sinks.batch_ids import BatchIds
from inorder.sinks.proof import fold_ranges
from inorder.storage import fs as sfs

META_DIR = "_inorder"
STAGING_DIR = f"{META_DIR}/staging"
#: Ending of every staged file: no ``*.parquet`` glob of the dataset matches it, so readers
#: that list the data never see rows that are not committed (the final name drops it).
STAGED_SUFFIX = ".parquet.staged"
COMMITS_DIR = f"{META_DIR}/commits"
COMPACTIONS_DIR = f"{META_DIR}/compactions"
CHECKPOINT_SUFFIX = ".checkpoint.json"
#: A commit checkpoint is written every this many committed batches.
DEFAULT_CHECKPOINT_INTERVAL = 100
#: Manifests of this many batches before the newest checkpoint are kept.
DEFAULT_MANIFEST_RETENTION = 100
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024


def manifest_name(batch_id: int) -> str:
    """File name of a batch manifest inside ``_inorder/commits``."""
    return f"{batch_id:020d}.json"


def final_name(partition_dir: str, batch_id: int, n: int) -> str:
    """Deterministic published name of the ``n``-th file of ``batch_id``."""
    name = f"part-{batch_id:010d}-{n:05d}.parquet"
    return f"{partition_dir}/{name}" if partition_dir else name


def partition_dir(partition_by: Sequence[str], values: Mapping[str, str | None]) -> str:
    """Hive-style directory (``col=value/...``) of a partition; values are URI-escaped."""
    parts = []
    for col in partition_by:
        value = values.get(col)
        text = HIVE_NULL if value is None else urllib.parse.quote(value, safe="")
        parts.append(f"{col}={text}")
    return "/".join(parts)


def encode_schema(schema: pa.Schema) -> str:
    """An Arrow schema as base64 IPC (kept in manifests so readers restore exact types)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_schema(text: str) -> pa.Schema:
    """Inverse of :func:`encode_schema`."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass(frozen=True)
class LiveFile:
    """A published data file of the dataset."""

    path: str
    """Relative to the dataset root."""
    rows: int
    size_bytes: int
    partition_values: dict[str, str | None]
    digest: str | None = None
    """Digest of the file's rows (:mod:`inorder.sinks.proof`); ``None`` in older commits."""
    level: int = 0
    """Compaction level: 0 for a batch's file, ``i + 1`` for a merge of level ``i`` files
    (:mod:`inorder.sinks.compaction_levels`); 0 in commit logs of older releases."""
    committed_at: float | None = None
    """When the batch of its oldest rows committed (epoch seconds); ``None`` if unknown."""


@dataclass
class DatasetState:
    """The committed content of a dataset: live files plus what the manifests say."""

    files: dict[str, LiveFile]
    batches: Sequence[int]
    """Ids of the done batches (a :class:`BatchIds` when read by :func:`load_state`)."""
    compactions: list[int]
    schema: pa.Schema | None
    partition_by: list[str]
    pending: list[str]
    """Manifests (relative paths) whose publication is not marked done."""
    checkpoint: int | None = None
    """Batch id of the commit checkpoint the state was read from, if any."""
    compaction_floor: int = -1
    """Highest compaction sequence number folded into that checkpoint (-1: none)."""
    owner: str | None = None
    """Owner recorded in the checkpoint (the owner of its last batch)."""
    offsets: dict[str, list[list[int]]] = field(default_factory=dict)
    """Per ``"<topic>/<partition>"``, the offset ranges the done batches consumed, folded
    (:func:`inorder.sinks.proof.fold_ranges`); empty for commits of older releases."""


_MANIFEST_CACHE: dict[tuple[str, str], dict[str, Any]] = {}
#: The newest commit checkpoint read per dataset: (relative path, parsed document).
_CHECKPOINT_CACHE: dict[str, tuple[str, dict[str, Any]]] = {}
#: The live files each manifest, record or checkpoint names, per (dataset, relative path):
#: every compactor round reads the whole state, and building its entries dominated that.
_FILES_CACHE: dict[tuple[str, str], dict[str, LiveFile]] = {}
#: How often :func:`load_state` starts over when metadata it listed was deleted meanwhile
#: (by a checkpoint's cleanup); each retry sees a newer checkpoint.
LOAD_ATTEMPTS = 8


def read_manifest(location: sfs.Location, rel: str) -> dict[str, Any]:
    """Parse a manifest (immutable once created: cached per process)."""
    key = (location.uri, rel)
    cached = _MANIFEST_CACHE.get(key)
    if cached is None:
        cached = json.loads(sfs.read_bytes(location, location.join(rel)))
        if len(_MANIFEST_CACHE) > 100_000:
            _MANIFEST_CACHE.clear()
        _MANIFEST_CACHE[key] = cached
    return cached


def forget_manifest(location: sfs.Location, rel: str) -> None:
    """Drop a deleted manifest from the per-process cache."""
    _MANIFEST_CACHE.pop((location.uri, rel), None)
    _FILES_CACHE.pop((location.uri, rel), None)


def checkpoint_name(batch_id: int) -> str:
    """File name of the commit checkpoint of ``batch_id`` inside ``_inorder/commits``."""
    return f"{batch_id:020d}{CHECKPOINT_SUFFIX}"


def read_checkpoint(location: sfs.Location, batch_id: int) -> dict[str, Any]:
    """Parse a commit checkpoint (immutable; the newest one per dataset is cached)."""
    rel = f"{COMMITS_DIR}/{checkpoint_name(batch_id)}"
    cached = _CHECKPOINT_CACHE.get(location.uri)
    if cached is not None and cached[0] == rel:
        return cached[1]
    doc: dict[str, Any] = json.loads(sfs.read_bytes(location, location.join(rel)))
    _CHECKPOINT_CACHE[location.uri] = (rel, doc)
    return doc


def is_not_found(exc: BaseException) -> bool:
    """Whether an error from a filesystem call means the file does not exist."""
    if isinstance(exc, FileNotFoundError):
        return True
    text = str(exc).lower()
    return isinstance(exc, OSError) and ("not found" in text or "does not exist" in text)


@dataclass
class CommitListing:
    """One listing of ``_inorder/commits``."""

    manifests: list[int]
    done: set[int]
    checkpoints: list[int]

    @property
    def newest_checkpoint(self) -> int | None:
        """Batch id of the newest commit checkpoint."""
        return self.checkpoints[-1] if self.checkpoints else None


def list_commits(location: sfs.Location) -> CommitListing:
    """Batch manifests, done markers and commit checkpoints in ``_inorder/commits``."""
    listing = CommitListing([], set(), [])
    for info in sfs.list_files(location, location.join(COMMITS_DIR)):
        stem, _, ext = info.base_name.partition(".")
        if not stem.isdigit():
            continue
        if ext == "json":
            listing.manifests.append(int(stem))
        elif ext == "done":
            listing.done.add(int(stem))
        elif "." + ext == CHECKPOINT_SUFFIX:
            listing.checkpoints.append(int(stem))
    listing.manifests.sort()
    listing.checkpoints.sort()
    return listing


def list_records(location: sfs.Location, directory: str) -> tuple[list[int], set[int], set[int]]:
    """Ids with a manifest, ids marked done, ids marked cleaned."""
    manifests: list[int] = []
    done: set[int] = set()
    cleaned: set[int] = set()
    for info in sfs.list_files(location, location.join(directory)):
        stem, _, ext = info.base_name.partition(".")
        if not stem.isdigit():
            continue
        if ext == "json":
            manifests.append(int(stem))
        elif ext == "done":
            done.add(int(stem))
        elif ext == "cleaned":
            cleaned.add(int(stem))
    return sorted(manifests), done, cleaned


def load_state(location: sfs.Location, include_pending_compactions: bool = False) -> DatasetState:
    """The committed dataset: files of done batch manifests, with done compactions applied.

    Compactions are listed *before* batches: a compaction only replaces files of batches
    that were done before it was created, so every file it replaces belongs to a batch this
    listing sees, and a reader never counts a batch's rows twice or partially.
    ``include_pending_compactions`` also applies compactions not yet marked done: a
    compactor plans with them so that no file is ever replaced twice.

    The state starts from the newest commit checkpoint (``<B>.checkpoint.json``: the live
    files as of batch ``B`` and compaction ``S``), then applies the done manifests after
    ``B`` and the compactions after ``S``. Manifests after a checkpoint are deleted only
    once that checkpoint is deleted, so if the checkpoint still exists when everything was
    read, nothing the state needed was missing; otherwise (or when a listed file vanished
    under a cleanup) the read starts over from the newer checkpoint.
    """
    for attempt in range(LOAD_ATTEMPTS):
        try:
            state = _load_state_once(location, include_pending_compactions)
        except OSError as exc:
            if not is_not_found(exc) or attempt == LOAD_ATTEMPTS - 1:
                raise
            continue
        if state.checkpoint is None:
            return state
        rel = f"{COMMITS_DIR}/{checkpoint_name(state.checkpoint)}"
        if sfs.exists(location, location.join(rel)):
            return state
    raise SinkError(
        f"{location.uri}: the commit log changed under every one of {LOAD_ATTEMPTS} reads"
    )


def _load_state_once(location: sfs.Location, include_pending_compactions: bool) -> DatasetState:
    comp_ids, comp_done, _ = list_records(location, COMPACTIONS_DIR)
    listing = list_commits(location)
    files: dict[str, LiveFile] = {}
    schema: pa.Schema | None = None
    partition_by: list[str] = []
    batches = BatchIds()
    base = listing.newest_checkpoint
    floor = -1
    owner: str | None = None
    offsets: dict[str, list[list[int]]] = {}
    if base is not None:
        doc = read_checkpoint(location, base)
        offsets = fold_ranges(doc.get("offsets", {}), {})
        files.update(live_files(location, f"{COMMITS_DIR}/{checkpoint_name(base)}", doc))
        batches = BatchIds(doc["batches"])
        floor = int(doc["compaction_seq"])
        if doc.get("schema"):
            schema = decode_schema(doc["schema"])
        partition_by = list(doc.get("partition_by", []))
        owner = doc.get("owner")
    pending: list[str] = []
    for bid in listing.manifests:
        if base is not None and bid <= base:
            continue  # folded into the checkpoint
        rel = f"{COMMITS_DIR}/{manifest_name(bid)}"
        if bid not in listing.done:
            pending.append(rel)
            continue
        manifest = read_manifest(location, rel)
        batches.append(bid)
        if manifest.get("schema"):
            schema = decode_schema(manifest["schema"])
        partition_by = list(manifest.get("partition_by", partition_by))
        offsets = fold_ranges(offsets, manifest.get("offsets", {}))
        files.update(live_files(location, rel, manifest, manifest.get("created_at")))
    compactions: list[int] = []
    for seq in comp_ids:
        if seq <= floor:
            continue  # folded into the checkpoint
        rel = f"{COMPACTIONS_DIR}/{manifest_name(seq)}"
        if seq not in comp_done:
            pending.append(rel)
            if not include_pending_compactions:
                continue
        manifest = read_manifest(location, rel)
        compactions.append(seq)
        for old in manifest["replaces"]:
            files.pop(old, None)
        files.update(live_files(location, rel, manifest))
    return DatasetState(
        files, batches, compactions, schema, partition_by, pending, base, floor, owner, offsets
    )


def newest_checkpoint(location: sfs.Location) -> dict[str, Any] | None:
    """The newest commit checkpoint of a dataset, ``None`` if it has none."""
    for attempt in range(LOAD_ATTEMPTS):
        newest = list_commits(location).newest_checkpoint
        if newest is None:
            return None
        try:
            return read_checkpoint(location, newest)
        except OSError as exc:  # replaced by a newer one meanwhile
            if not is_not_found(exc) or attempt == LOAD_ATTEMPTS - 1:
                raise
    return None


def batch_owner(location: sfs.Location, batch_id: int) -> str | None:
    """The owner recorded for a committed batch (its manifest, else the checkpoint's)."""
    try:
        owner = read_manifest(location, f"{COMMITS_DIR}/{manifest_name(batch_id)}").get("owner")
        return None if owner is None else str(owner)
    except OSError as exc:
        if not is_not_found(exc):
            raise
    doc = newest_checkpoint(location)
    if doc is None or batch_id > int(doc["batch_id"]):
        return None
    owner = doc.get("owner")
    return None if owner is None else str(owner)


def live_files(
    location: sfs.Location, rel: str, doc: Mapping[str, Any], committed_at: float | None = None
) -> dict[str, LiveFile]:
    """The files of an immutable manifest, record or checkpoint ``rel`` (built once per
    process; read only)."""
    key = (location.uri, rel)
    cached = _FILES_CACHE.get(key)
    if cached is None:
        cached = {e["final"]: live_file(e, committed_at) for e in doc["files"]}
        if len(_FILES_CACHE) > 100_000:
            _FILES_CACHE.clear()
        _FILES_CACHE[key] = cached
    return cached


def cached_live_files(location: sfs.Location, rel: str) -> dict[str, LiveFile] | None:
    """The files of ``rel`` if :func:`live_files` built them already (read only)."""
    return _FILES_CACHE.get((location.uri, rel))


def remember_checkpoint(
    location: sfs.Location, rel: str, doc: dict[str, Any], files: dict[str, LiveFile] | None
) -> None:
    """Cache a commit checkpoint this process just created (``files``: its entries as
    LiveFiles, ``None`` if not at hand), as if read back: it is immutable once created."""
    _CHECKPOINT_CACHE[location.uri] = (rel, doc)
    if files is not None:
        _FILES_CACHE[(location.uri, rel)] = files


def live_file(entry: Mapping[str, Any], committed_at: float | None = None) -> LiveFile:
    """A file entry of a manifest, record or checkpoint; ``committed_at`` is the batch
    manifest's time, for entries that carry none of their own."""
    at = entry.get("committed_at", committed_at)
    return LiveFile(
        path=entry["final"],
        rows=int(entry["rows"]),
        size_bytes=int(entry["size_bytes"]),
        partition_values=dict(entry.get("partition_values", {})),
        digest=entry.get("digest"),
        level=int(entry.get("level", 0)),
        committed_at=None if at is None else float(at),
    )


def file_entry(f: LiveFile) -> dict[str, Any]:
    """The entry of a live file in a commit checkpoint (inverse of :func:`live_file`)."""
    entry: dict[str, Any] = {
        "final": f.path,
        "rows": f.rows,
        "size_bytes": f.size_bytes,
        "partition_values": f.partition_values,
    }
    if f.digest is not None:
        entry["digest"] = f.digest
    if f.level:
        entry["level"] = f.level
    if f.committed_at is not None:
        entry["committed_at"] = f.committed_at
    return entry


def complete_manifest(location: sfs.Location, rel: str) -> None:
    """Publish every file of a manifest that is not published yet, then mark it done.

    Idempotent: run again after a crash at any point, it finishes the same work.
    """
    manifest = read_manifest(location, rel)
    for entry in manifest["files"]:
        final = location.join(entry["final"])
        if sfs.exists(location, final):
            continue
        staged = location.join(entry["staged"])
        try:
            sfs.move(location, staged, final)
        except OSError:
            # Another process (a restarted driver, a compactor) may have published it first.
            if sfs.exists(location, final):
                continue
            if not sfs.exists(location, staged):
                raise SinkError(
                    f"{location.uri}: {rel} lists {entry['staged']} but it is gone and "
                    f"{entry['final']} was never published"
                ) from None
            raise
    if not location.is_s3:
        for directory in {location.join(e["final"]).rsplit("/", 1)[0] for e in manifest["files"]}:
            sfs.fsync_dir(directory)
    done = location.join(rel.removesuffix(".json") + ".done")
    sfs.write_bytes(location, done, json.dumps({"done_at": time.time()}).encode())


def file_batch_id(path: str) -> int | None:
    """The batch id in a published file's name (``part-<batch_id:010d>-...``), else ``None``."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith("part-") and name[5:15].isdigit():
        return int(name[5:15])
    return None


def check_writable(location: sfs.Location) -> None:
    """Probe the location with create-only writes and a delete; :class:`SinkError` if unusable.

    On S3 the probe is written twice and the second write must be refused: a store that
    ignores ``If-None-Match: *`` cannot commit exactly once, so it is refused here.
    """
    secrets = (location.s3.secret_access_key, location.s3.session_token) if location.s3 else ()
    probe = location.join(META_DIR, f"probe-{uuid.uuid4().hex}")
    try:
        if location.is_s3:
            sfs.check_conditional_writes(location, probe)
        else:
            location.filesystem.create_dir(location.join(COMMITS_DIR), recursive=True)
            sfs.put_if_absent(location, probe, b"probe")
            sfs.delete_quietly(location, probe)
    except PermissionError as exc:
        raise SinkError(f"{location.uri} is not writable: {exc.strerror}") from None
    except (SinkError, OSError) as exc:
        raise SinkError(
            f"{location.uri} is not usable: {sfs.describe_error(exc, secrets)}"
        ) from None
