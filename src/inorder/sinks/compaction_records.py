"""Records of ``_inorder/compactions`` (compactions and output repairs) and what follows them.

A record's new files are staged apart (:class:`StagedRecord`), then one manifest created if
absent commits them; staging directories of runs killed before their commit point are
deleted once they can no longer commit (:func:`clean_stale_staging`); the files a record
replaced are deleted after the grace period (:func:`cleanup_parquet`). Shared by compaction
(:mod:`inorder.sinks.compaction`) and output repair (:mod:`inorder.ops.repair_output`); the
protocol is described in :mod:`inorder.sinks.compaction`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from inorder.errors import InorderError
from inorder.sinks.commit_log import (
    COMPACTIONS_DIR,
    STAGED_SUFFIX,
    STAGING_DIR,
    complete_manifest,
    is_not_found,
    list_records,
    manifest_name,
    read_manifest,
)
from inorder.sinks.parquet_writer import ROW_GROUP_BUFFER_BYTES, sort_keys, sort_rows
from inorder.sinks.proof import add_digests, format_digest, table_digest
from inorder.storage import fs as sfs


class StagedRecord:
    """Record ``seq`` of ``_inorder/compactions`` (a compaction or an output repair) in the
    making: its new files are staged apart, then one manifest created if absent commits them.

    Used around the work that writes the files::

        with StagedRecord(location, "repair", seq, compression) as record:
            record.stage(table, directory, stem, partition_values)  # per new file
            record.commit(replaces, taken=InorderError(...))

    Before :meth:`commit` creates ``_inorder/compactions/<seq:020d>.json`` (the commit
    point), an exception deletes every staged file. Leaving the block after the commit
    publishes the new files and marks the record done (:func:`complete_manifest`); if that
    fails, or the block raises after the commit, the staged files stay: the manifest names
    them and the next compaction or repair finishes the publication.
    """

    def __init__(
        self,
        location: sfs.Location,
        kind: Literal["compaction", "repair"],
        seq: int,
        compression: str,
    ) -> None:
        self.location = location
        self.kind = kind
        self.seq = seq
        self.compression = compression
        self.staging = staging_dir(kind[0], seq)
        """Relative path of this run's staging directory (``c<seq>-<id>`` or ``r<seq>-<id>``)."""
        self.rel = f"{COMPACTIONS_DIR}/{manifest_name(seq)}"
        """Relative path of the manifest."""
        self.files: list[dict[str, Any]] = []
        """The manifest's ``files`` entries, one per staged file."""
        self._committed = False

    def stage(
        self,
        table: pa.Table,
        directory: str,
        stem: str,
        partition_values: Mapping[str, str | None],
        **fields: Any,
    ) -> None:
        """Write ``table`` as a staged file to be published as ``<directory>/<stem>.parquet``;
        ``fields`` go into its manifest entry (a compaction's ``level``, ``committed_at``)."""
        location = self.location
        staged = "/".join(p for p in (self.staging, directory, stem + STAGED_SUFFIX) if p)
        full = location.join(staged)
        if not location.is_s3:
            location.filesystem.create_dir(full.rsplit("/", 1)[0], recursive=True)
        with location.filesystem.open_output_stream(full) as out:
            pq.write_table(table, out, compression=self.compression)
        digest = format_digest(table_digest(table))
        self._add(staged, directory, stem, table.num_rows, partition_values, digest, fields)

    def stage_tables(
        self,
        tables: Iterable[pa.Table],
        schema: pa.Schema,
        directory: str,
        stem: str,
        partition_values: Mapping[str, str | None],
        sort_by: Sequence[str] = (),
        **fields: Any,
    ) -> None:
        """:meth:`stage` of the rows of ``tables`` (each of ``schema``) as one file, holding
        at most a row group's worth (:data:`ROW_GROUP_BUFFER_BYTES`) of them in memory; each
        row group's rows sorted by the columns of ``sort_by`` the schema has (stably)."""
        keys = sort_keys(sort_by, schema)

        def write(pending: list[pa.Table]) -> None:
            writer.write_table(sort_rows(pa.concat_tables(pending), keys))

        location = self.location
        staged = "/".join(p for p in (self.staging, directory, stem + STAGED_SUFFIX) if p)
        full = location.join(staged)
        if not location.is_s3:
            location.filesystem.create_dir(full.rsplit("/", 1)[0], recursive=True)
        rows = digest = size = 0
        pending: list[pa.Table] = []
        with (
            location.filesystem.open_output_stream(full) as out,
            pq.ParquetWriter(out, schema, compression=self.compression) as writer,
        ):
            for table in tables:
                rows += table.num_rows
                digest = add_digests(digest, table_digest(table))
                pending.append(table)
                size += table.nbytes
                if size >= ROW_GROUP_BUFFER_BYTES:
                    write(pending)
                    pending, size = [], 0
            if pending:
                write(pending)
        self._add(staged, directory, stem, rows, partition_values, format_digest(digest), fields)

    def _add(
        self,
        staged: str,
        directory: str,
        stem: str,
        rows: int,
        partition_values: Mapping[str, str | None],
        digest: str,
        fields: Mapping[str, Any],
    ) -> None:
        """The manifest entry of a file just staged."""
        self.files.append(
            {
                "staged": staged,
                "final": "/".join(p for p in (directory, stem + ".parquet") if p),
                "rows": rows,
                "size_bytes": int(
                    self.location.filesystem.get_file_info(self.location.join(staged)).size or 0
                ),
                "partition_values": partition_values,
                "digest": digest,
                **fields,
            }
        )

    def commit(self, replaces: list[str], taken: InorderError, **fields: Any) -> str:
        """Create the manifest (the commit point): the staged files replace ``replaces``.

        ``fields`` are recorded in the manifest too. ``taken`` is raised when another run
        committed ``seq`` first. Returns the manifest's relative path.
        """
        manifest = {
            "format": 1,
            "kind": self.kind,
            "seq": self.seq,
            "created_at": time.time(),
            **fields,
            "replaces": replaces,
            "files": self.files,
        }
        try:
            sfs.put_if_absent(
                self.location, self.location.join(self.rel), json.dumps(manifest).encode()
            )
        except sfs.AlreadyExists:
            raise taken from None
        self._committed = True
        return self.rel

    def __enter__(self) -> StagedRecord:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        location = self.location
        staging = location.join(self.staging)
        if self._committed:
            if exc_type is None:
                complete_manifest(location, self.rel)
                sfs.delete_dir_quietly(location, staging)
            return
        _delete_tree(location, staging)


def _delete_tree(location: sfs.Location, path: str) -> None:
    """Delete a staging directory and everything in it (on S3, also keys written meanwhile)."""
    sfs.delete_dir_quietly(location, path)
    for leftover in sfs.list_files(location, path, recursive=True):
        sfs.delete_quietly(location, leftover.path)


def remove_replaced(location: sfs.Location, seq: int, replaces: list[str]) -> None:
    """Delete the files that record ``seq`` replaced, then mark the record cleaned."""
    for rel in replaces:
        sfs.delete_quietly(location, location.join(rel))
    sfs.write_bytes(location, _record_base(location, seq) + ".cleaned", b"{}")


def _record_base(location: sfs.Location, seq: int) -> str:
    """Path of record ``seq``'s manifest without ``.json`` (``.done``/``.cleaned`` follow)."""
    return location.join(COMPACTIONS_DIR, manifest_name(seq).removesuffix(".json"))


def staging_dir(kind: str, seq: int) -> str:
    """A fresh staging directory for compaction (``kind`` ``c``) or repair (``r``) ``seq``.

    Unique per run: two runs that picked the same ``seq`` stage apart, so the one that
    loses the create-if-absent deletes only its own files.
    """
    return f"{STAGING_DIR}/{kind}{seq}-{uuid.uuid4().hex[:12]}"


def _staging_seq(name: str) -> int | None:
    """``seq`` of a compaction/repair staging directory (``c<seq>[-<id>]``), else ``None``."""
    if name[:1] not in ("c", "r"):
        return None
    digits = name[1:].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


def clean_stale_staging(location: sfs.Location, floor: int = -1) -> list[str]:
    """Delete staging directories of compactions and repairs that can no longer commit.

    The directory of a run that picked sequence number ``seq`` is stale once a record of
    ``seq`` or a later one exists (that run lost the race for ``seq``, or was killed) and no
    record still being published names a file in it. Runs staging for a ``seq`` above every
    record (and above ``floor``, the sequence number folded into the newest commit
    checkpoint) are left alone: they may be writing right now. Returns the deleted
    directories (relative paths).
    """
    comp_ids, done, _ = list_records(location, COMPACTIONS_DIR)
    newest = max(comp_ids[-1] if comp_ids else -1, floor)
    needed: set[str] = set()
    for seq in comp_ids:
        if seq in done:
            continue
        try:
            manifest = read_manifest(location, f"{COMPACTIONS_DIR}/{manifest_name(seq)}")
        except OSError as exc:
            if is_not_found(exc):
                continue
            raise
        for entry in manifest["files"]:
            parts = str(entry["staged"]).split("/")
            if len(parts) > 3:
                needed.add(parts[2])
    deleted: list[str] = []
    for info in location.filesystem.get_file_info(
        pafs.FileSelector(location.join(STAGING_DIR), allow_not_found=True)
    ):
        of = _staging_seq(info.base_name)
        if of is None or of > newest or info.base_name in needed:
            continue
        _delete_tree(location, info.path)
        deleted.append(f"{STAGING_DIR}/{info.base_name}")
    return deleted


def cleanup_parquet(location: sfs.Location, grace_seconds: float) -> list[str]:
    """Delete files replaced by compactions done more than ``grace_seconds`` ago."""
    comp_ids, done, cleaned = list_records(location, COMPACTIONS_DIR)
    deleted: list[str] = []
    now = time.time()
    for seq in comp_ids:
        if seq not in done or seq in cleaned:
            continue
        try:
            if now - _done_at(location, seq) < grace_seconds:
                continue
            manifest = read_manifest(location, f"{COMPACTIONS_DIR}/{manifest_name(seq)}")
        except OSError as exc:
            if is_not_found(exc):
                continue  # cleaned by another compactor, then removed by a commit checkpoint
            raise
        remove_replaced(location, seq, manifest["replaces"])
        deleted.extend(manifest["replaces"])
    return deleted


#: When each record was marked done, per (dataset, seq): a round of a compactor otherwise
#: reads the marker of every record still in its grace period (an hour of records).
_DONE_AT: dict[tuple[str, int], float] = {}


def _done_at(location: sfs.Location, seq: int) -> float:
    """The ``done_at`` of record ``seq``'s ``.done`` marker (read once per process).

    A marker written again by a second completer carries a later time; the first one read
    is kept, which is no later than when readers could first switch to the new files.
    """
    key = (location.uri, seq)
    cached = _DONE_AT.get(key)
    if cached is None:
        marker = sfs.read_bytes(location, _record_base(location, seq) + ".done")
        cached = float(json.loads(marker).get("done_at", 0.0))
        if len(_DONE_AT) > 100_000:
            _DONE_AT.clear()
        _DONE_AT[key] = cached
    return cached
