"""The commit proofs of a Parquet dataset, gathered for :mod:`inorder.ops.verify`.

Read from ``_inorder/`` only (plus one listing of the data files): the newest commit
checkpoint (folded ranges and live files with digests), the batch manifests after it
(ranges, files, rows, digests), the compaction and repair records (a compaction's new files
must hold exactly the rows it replaced: the digests add up), and what a listing reader of
the documented layout (``*.parquet`` outside ``_``/``.`` directories) sees.
"""

from __future__ import annotations

from typing import Any

from inorder.ops.verify_evidence import BatchProof, Evidence, FileProof, Problem
from inorder.sinks.batch_ids import BatchIds
from inorder.sinks.commit_log import (
    COMMITS_DIR,
    COMPACTIONS_DIR,
    file_batch_id,
    list_commits,
    list_records,
    load_state,
    manifest_name,
    read_checkpoint,
    read_manifest,
)
from inorder.sinks.proof import add_digests, format_digest, parse_digest
from inorder.storage import fs as sfs


def collect_parquet(sink: Any, owner: str | None) -> Evidence:
    """The evidence of a :class:`~inorder.sinks.parquet.ParquetSink`'s dataset."""
    loc: sfs.Location = sink.location
    state = load_state(loc)
    listing = list_commits(loc)
    evidence = Evidence("parquet", sink.describe(), loc, [], [])
    digests: dict[str, str | None] = {}
    base = state.checkpoint
    if base is not None:
        doc = read_checkpoint(loc, base)
        evidence.folded_upto = base
        evidence.folded_batches = len(BatchIds(doc["batches"]))
        evidence.folded = {k: [list(p) for p in v] for k, v in doc.get("offsets", {}).items()}
        if "offsets" not in doc:
            evidence.notes.append(
                f"the commit checkpoint of batch {base} records no ranges (written by a "
                "release before commits carried proofs): ranges are checked after it"
            )
        digests.update({e["final"]: e.get("digest") for e in doc["files"]})
    pending: set[str] = set()
    for bid in listing.manifests:
        if base is not None and bid <= base:
            continue  # folded into the checkpoint
        manifest = read_manifest(loc, f"{COMMITS_DIR}/{manifest_name(bid)}")
        files = [
            FileProof(e["final"], int(e["rows"]), e.get("digest"), bid) for e in manifest["files"]
        ]
        if bid not in listing.done:
            pending.update(f.path for f in files)
            evidence.notes.append(
                f"batch {bid} is committed but its publication is not finished (a running "
                "pipeline, or its next run finishes it): not checked yet"
            )
            continue
        if owner is not None and manifest.get("owner") not in (None, owner):
            evidence.problems.append(
                Problem(
                    "foreign_batch",
                    f"committed by pipeline checkpoint {manifest.get('owner')}, not {owner}",
                    bid,
                )
            )
        offsets = manifest.get("offsets")
        ranges = None if offsets is None else {k: (int(a), int(b)) for k, (a, b) in offsets.items()}
        evidence.batches.append(BatchProof(bid, ranges, files))
        digests.update({f.path: f.digest for f in files})
    evidence.live = [
        FileProof(f.path, f.rows, f.digest, file_batch_id(f.path)) for f in state.files.values()
    ]
    grace = _check_rewrites(loc, state.compaction_floor, digests, evidence)
    _check_listing(loc, set(state.files) | pending, grace, evidence)
    return evidence


def _check_rewrites(
    loc: sfs.Location, floor: int, digests: dict[str, str | None], evidence: Evidence
) -> dict[str, int]:
    """Compactions hold the rows they replaced (digests add up); returns the replaced files
    still in their grace period (path -> record), which listing readers may still see."""
    ids, done, cleaned = list_records(loc, COMPACTIONS_DIR)
    grace: dict[str, int] = {}
    for seq in ids:
        if seq not in done:
            continue  # not committed: its staged files are invisible
        try:
            record = read_manifest(loc, f"{COMPACTIONS_DIR}/{manifest_name(seq)}")
        except OSError:
            continue  # cleaned up after a checkpoint folded it
        if seq not in cleaned:
            grace.update({old: seq for old in record["replaces"]})
        if seq <= floor:
            continue
        old = [digests.get(p) for p in record["replaces"]]
        new = [e.get("digest") for e in record["files"]]
        for e in record["files"]:
            digests[e["final"]] = e.get("digest")
        if record.get("kind") != "compaction" or None in old or None in new:
            continue  # a repair removes rows; older records carry no digests
        before = add_digests(*(parse_digest(d) for d in old if d is not None))
        after = add_digests(*(parse_digest(d) for d in new if d is not None))
        if before != after:
            evidence.problems.append(
                Problem(
                    "compaction_digest",
                    f"compaction {seq}'s files hash to {format_digest(after)}, the "
                    f"{len(old)} files it replaced to {format_digest(before)}",
                    file=record["files"][0]["final"] if record["files"] else None,
                )
            )
    return grace


def _check_listing(
    loc: sfs.Location, expected: set[str], grace: dict[str, int], evidence: Evidence
) -> None:
    """Data files a listing reader sees (``*.parquet`` outside ``_`` and ``.`` directories)
    that no commit names."""
    prefix = len(loc.root.rstrip("/")) + 1
    lingering = 0
    for info in sfs.list_files(loc, loc.root, recursive=True):
        rel = info.path[prefix:]
        if not rel.endswith(".parquet") or any(p[:1] in "_." for p in rel.split("/")):
            continue
        if rel in expected:
            continue
        if rel in grace:
            lingering += 1
            continue
        evidence.problems.append(
            Problem(
                "uncommitted_visible",
                "listing readers (a glob, pyarrow, Spark) read it, but no commit names it",
                file_batch_id(rel),
                file=rel,
            )
        )
    if lingering:
        evidence.notes.append(
            f"{lingering} file(s) replaced by a compaction are still in their grace period: "
            "listing readers count their rows twice until it ends (readers of the committed "
            "file list do not)"
        )
