"""Commit checkpoints: the Parquet sink's commit log kept to a bounded number of files.

Every batch adds a manifest and a ``.done`` marker to ``_inorder/commits``. Every
``checkpoint_interval`` batches the driver consolidates them (:func:`write_checkpoint`):

1. list ``_inorder/compactions`` then ``_inorder/commits`` (the order readers use);
2. start from the newest checkpoint (if any) and apply the done manifests after it, up to
   the first one not done: batch ``B``; then the done compactions after the checkpoint's,
   up to the first one not done or replacing a file of a batch after ``B``: compaction ``S``;
3. create ``_inorder/commits/<B:020d>.checkpoint.json`` *if absent* (the same atomic
   create-if-absent as manifests): the live files as of (``B``, ``S``), the committed batch
   ids as ranges, the schema, partitioning and owner;
4. clean up (:func:`cleanup_commit_log`): delete every checkpoint but the newest two, then
   the done manifests (``.json`` first, then ``.done``) up to
   ``min(newest - manifest_retention, previous checkpoint)``, then finished (``.cleaned``)
   compaction records folded into the previous checkpoint, never the newest record.

Why this is safe for readers (:func:`~inorder.sinks.commit_log.load_state`): a manifest or
compaction record after a checkpoint is deleted only once that checkpoint itself was deleted,
so a reader that finds its starting checkpoint still present after reading had everything
it needed; otherwise it starts over from the newer checkpoint. A crash at any step leaves
either no new checkpoint (nothing changed) or a complete one plus files the next cleanup
deletes. Manifests not yet done are never folded nor deleted.
"""

from __future__ import annotations

import json
import time
from typing import Any

from inorder.sinks.batch_ids import BatchIds
from inorder.sinks.commit_log import (
    COMMITS_DIR,
    COMPACTIONS_DIR,
    DEFAULT_MANIFEST_RETENTION,
    LiveFile,
    cached_live_files,
    checkpoint_name,
    file_batch_id,
    file_entry,
    forget_manifest,
    list_commits,
    list_records,
    live_files,
    manifest_name,
    read_checkpoint,
    read_manifest,
    remember_checkpoint,
)
from inorder.sinks.proof import fold_ranges
from inorder.storage import fs as sfs


def write_checkpoint(
    location: sfs.Location, manifest_retention: int = DEFAULT_MANIFEST_RETENTION
) -> int | None:
    """Consolidate the commit log into a checkpoint, then clean up; returns its batch id.

    ``None`` when there is no done batch after the newest checkpoint. Only the writing
    driver calls this (one driver per dataset); compactors may run concurrently.
    """
    comp_ids, comp_done, _ = list_records(location, COMPACTIONS_DIR)
    listing = list_commits(location)
    base = listing.newest_checkpoint
    # The checkpoint's entries, kept as parsed (the base's) or built once from a manifest's:
    # turning every live file into a LiveFile and back cost seconds at 100,000 files.
    entries: dict[str, dict[str, Any]] = {}
    # The same files as LiveFiles, when the base's are cached (readers of the new
    # checkpoint in this process then need not build them again); ``None``: not cached.
    live: dict[str, LiveFile] | None = None
    batches = BatchIds()
    floor = -1
    schema: str | None = None
    partition_by: list[str] = []
    owner: str | None = None
    offsets: dict[str, list[list[int]]] = {}
    if base is not None:
        doc = read_checkpoint(location, base)
        offsets = fold_ranges(doc.get("offsets", {}), {})
        entries = {e["final"]: e for e in doc["files"]}
        cached = cached_live_files(location, f"{COMMITS_DIR}/{checkpoint_name(base)}")
        live = None if cached is None else dict(cached)
        batches = BatchIds(doc["batches"])
        floor = int(doc["compaction_seq"])
        schema = doc.get("schema")
        partition_by = list(doc.get("partition_by", []))
        owner = doc.get("owner")
    upto = base
    for bid in listing.manifests:
        if base is not None and bid <= base:
            continue
        if bid not in listing.done:
            break  # not published yet: this and later batches stay in their manifests
        rel = f"{COMMITS_DIR}/{manifest_name(bid)}"
        manifest = read_manifest(location, rel)
        batches.append(bid)
        schema = manifest.get("schema") or schema
        partition_by = list(manifest.get("partition_by", partition_by))
        owner = manifest.get("owner")
        offsets = fold_ranges(offsets, manifest.get("offsets", {}))
        added = live_files(location, rel, manifest, manifest.get("created_at"))
        entries.update((path, file_entry(f)) for path, f in added.items())
        if live is not None:
            live.update(added)
        upto = bid
    if upto is None or upto == base:
        return None
    seq_upto = floor
    for seq in comp_ids:
        if seq <= floor:
            continue
        if seq not in comp_done:
            break
        rel = f"{COMPACTIONS_DIR}/{manifest_name(seq)}"
        manifest = read_manifest(location, rel)
        # A checkpoint of batch B may only hold compactions of files of batches <= B.
        ids = (file_batch_id(p) for p in manifest["replaces"])
        if any(b is not None and b > upto for b in ids):
            break
        for old in manifest["replaces"]:
            entries.pop(old, None)
            if live is not None:
                live.pop(old, None)
        added = live_files(location, rel, manifest)
        entries.update((path, file_entry(f)) for path, f in added.items())
        if live is not None:
            live.update(added)
        seq_upto = seq
    doc = {
        "format": 1,
        "kind": "checkpoint",
        "batch_id": upto,
        "compaction_seq": seq_upto,
        "created_at": time.time(),
        "batches": batches.ranges(),
        "owner": owner,
        "partition_by": partition_by,
        "schema": schema,
        # The folded ranges of every batch up to here: the proof survives the manifests.
        "offsets": offsets,
        # With each file's level and commit time: the level rule survives the manifests.
        "files": list(entries.values()),
    }
    rel = f"{COMMITS_DIR}/{checkpoint_name(upto)}"
    try:
        sfs.put_if_absent(location, location.join(rel), json.dumps(doc).encode())
    except sfs.AlreadyExists:
        pass  # written before a crash, it describes the same batches; keep it
    else:
        # Ours: the next reader in this process (the compactor's round, the next
        # checkpoint) starts from it without parsing it and building its files again.
        remember_checkpoint(location, rel, doc, live)
    cleanup_commit_log(location, manifest_retention)
    return upto


def cleanup_commit_log(
    location: sfs.Location, manifest_retention: int = DEFAULT_MANIFEST_RETENTION
) -> list[str]:
    """Delete what the two newest checkpoints make obsolete; returns the deleted paths.

    Idempotent, and safe to interrupt at any point (see the module docstring).
    """
    listing = list_commits(location)
    deleted: list[str] = []

    def delete(rel: str) -> None:
        sfs.delete_quietly(location, location.join(rel))
        forget_manifest(location, rel)
        deleted.append(rel)

    # Older checkpoints go first: only then may what a reader of them needs be deleted.
    for old in listing.checkpoints[:-2]:
        delete(f"{COMMITS_DIR}/{checkpoint_name(old)}")
    if len(listing.checkpoints) < 2:
        return deleted  # a reader may still be working without any checkpoint
    previous, newest = listing.checkpoints[-2:]
    bound = min(newest - max(manifest_retention, 1), previous)
    manifests = set(listing.manifests)
    for bid in listing.manifests:
        if bid <= bound and bid in listing.done:
            # The manifest before its marker: a marker without a manifest is ignored, a
            # manifest without its marker would be taken for one still being published.
            delete(f"{COMMITS_DIR}/{manifest_name(bid)}")
            delete(f"{COMMITS_DIR}/{manifest_name(bid).removesuffix('.json')}.done")
    for bid in sorted(listing.done - manifests):
        if bid <= bound:
            delete(f"{COMMITS_DIR}/{manifest_name(bid).removesuffix('.json')}.done")
    previous_doc = _read_json(location, f"{COMMITS_DIR}/{checkpoint_name(previous)}")
    if previous_doc is None:
        return deleted
    folded = int(previous_doc["compaction_seq"])
    comp_ids, done, cleaned = list_records(location, COMPACTIONS_DIR)
    # The newest record always stays: the next compaction numbers itself after it.
    keep = comp_ids[-1] if comp_ids else -1
    for seq in comp_ids:
        if seq <= folded and seq != keep and seq in done and seq in cleaned:
            stem = f"{COMPACTIONS_DIR}/{manifest_name(seq).removesuffix('.json')}"
            for ext in (".json", ".done", ".cleaned"):
                delete(stem + ext)
    for seq in sorted((done | cleaned) - set(comp_ids)):
        if seq <= folded and seq < keep:
            stem = f"{COMPACTIONS_DIR}/{manifest_name(seq).removesuffix('.json')}"
            for ext in (".done", ".cleaned"):
                delete(stem + ext)
    return deleted


def _read_json(location: sfs.Location, rel: str) -> dict[str, Any] | None:
    data = sfs.read_bytes_if_exists(location, location.join(rel))
    if data is None:
        return None
    loaded: dict[str, Any] = json.loads(data)
    return loaded
