"""Exactly-once Parquet datasets on local disk or S3, committed per micro-batch.

Layout under the dataset root (``docs/sinks.md`` describes the protocol for readers)::

    <root>/<col>=<value>/.../part-<batch_id:010d>-<n:05d>.parquet   published data (hive style)
    <root>/<col>=<value>/.../compacted-<seq:010d>-<n:05d>.parquet   published by compaction
    <root>/_inorder/staging/<batch_id>/<task_key>/part-<n:05d>.parquet.staged   one per
        output partition per task (a task writes the rows of all its topic-partitions);
        releases before staged under ``<task_key>/<col>=<value>/``, one task key per
        topic-partition
    <root>/_inorder/commits/<batch_id:020d>.json    batch manifest, created if absent
    <root>/_inorder/commits/<batch_id:020d>.done     the manifest's files are all published
    <root>/_inorder/commits/<batch_id:020d>.checkpoint.json   live files as of that batch
    <root>/_inorder/compactions/<seq:020d>.json|.done|.cleaned

Commit of batch ``B`` (driver):

1. finish any half-done commit left by a crashed driver (once per process);
2. if ``commits/B.json`` exists the batch is committed: delete the new staged files, return
   ``False``;
3. create ``commits/B.json`` *if absent* (``link(2)`` locally, ``PUT If-None-Match: *`` on S3)
   listing each staged file and its deterministic final name; this is the commit point;
4. publish each file (``rename`` locally, server-side copy then delete on S3), skipping those
   already published;
5. create ``commits/B.done`` and delete the batch's staging directory (and those of earlier
   batches: files of failed attempts).

A crash anywhere before 3 leaves only staged files (invisible, deleted later); after 3 the
manifest decides and step 4 is redone from it by the next process.

Staged files (also those of compaction, ``staging/c<seq>-<id>/``, and of output repair,
``staging/r<seq>-<id>/``) end in :data:`STAGED_SUFFIX`, not ``.parquet``: no ``*.parquet``
glob matches them, also one that enters ``_inorder/`` (DuckDB's ``**`` does). Publishing
renames them to their final ``.parquet`` names. Manifests record both names, so one written
by a release that staged under ``.parquet`` names is completed all the same.

The names, manifests, committed state and publication live in
:mod:`inorder.sinks.commit_log` (shared with compaction, commit checkpoints and output
repair; re-exported here). Every ``checkpoint_interval`` batches the commit log is
consolidated into a checkpoint and old manifests are deleted
(:mod:`inorder.sinks.commit_checkpoint`); :func:`load_state` starts from the newest
checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from inorder.sinks import topic_bucket as tb
from inorder.sinks.base import BatchWriter, ConsumedOffsets, SinkError, WrittenFile
from inorder.sinks.batch_ids import BatchIds
from inorder.sinks.commit_log import (  # noqa: F401  (the caches: tests clear them)
    _CHECKPOINT_CACHE,
    _FILES_CACHE,
    _MANIFEST_CACHE,
    CHECKPOINT_SUFFIX,
    COMMITS_DIR,
    COMPACTIONS_DIR,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MANIFEST_RETENTION,
    DEFAULT_TARGET_FILE_SIZE,
    HIVE_NULL,
    LOAD_ATTEMPTS,
    META_DIR,
    STAGED_SUFFIX,
    STAGING_DIR,
    CommitListing,
    DatasetState,
    LiveFile,
    batch_owner,
    check_writable,
    checkpoint_name,
    complete_manifest,
    decode_schema,
    encode_schema,
    file_batch_id,
    final_name,
    forget_manifest,
    is_not_found,
    list_commits,
    list_records,
    live_file,
    load_state,
    manifest_name,
    newest_checkpoint,
    partition_dir,
    read_checkpoint,
    read_manifest,
)
from inorder.sinks.compaction_levels import (
    DEFAULT_FANOUT,
    DEFAULT_LEVELS,
    DEFAULT_MAX_MERGE_BYTES,
    check_level_settings,
    check_max_merge_bytes,
)
from inorder.sinks.evolution import schema_change
from inorder.sinks.file_sink import FileSink
from inorder.sinks.parquet_compactor import ParquetCompactor
from inorder.sinks.proof import consumed_ranges
from inorder.storage import fs as sfs

#: The sink, its readers, and the commit log's names (:mod:`inorder.sinks.commit_log`).
__all__ = [
    "CHECKPOINT_SUFFIX",
    "COMMITS_DIR",
    "COMPACTIONS_DIR",
    "COMPRESSIONS",
    "DEFAULT_CHECKPOINT_INTERVAL",
    "DEFAULT_MANIFEST_RETENTION",
    "DEFAULT_TARGET_FILE_SIZE",
    "HIVE_NULL",
    "LOAD_ATTEMPTS",
    "META_DIR",
    "ROW_GROUP_BUFFER_BYTES",
    "STAGED_SUFFIX",
    "STAGING_DIR",
    "TOTAL_BUFFER_BYTES",
    "BatchIds",
    "CommitListing",
    "DatasetState",
    "FileSink",
    "LiveFile",
    "ParquetBatchWriter",
    "ParquetSink",
    "batch_owner",
    "check_writable",
    "checkpoint_name",
    "committed_files",
    "complete_manifest",
    "decode_schema",
    "encode_schema",
    "file_batch_id",
    "final_name",
    "forget_manifest",
    "is_not_found",
    "list_commits",
    "list_records",
    "live_file",
    "load_state",
    "manifest_name",
    "newest_checkpoint",
    "partition_dir",
    "read_batch_range",
    "read_checkpoint",
    "read_committed",
    "read_manifest",
]

from inorder.sinks.parquet_read import (
    committed_files,
    read_batch_range,
    read_committed,
)
from inorder.sinks.parquet_writer import (
    COMPRESSIONS,
    ROW_GROUP_BUFFER_BYTES,
    TOTAL_BUFFER_BYTES,
    ParquetBatchWriter,
    safe_key,
)

# -- the sink ----------------------------------------------------------------------------------


class ParquetSink(FileSink):
    """A hive-partitioned Parquet dataset committed exactly once per micro-batch.

    ``path`` is a local path, ``file://`` URI or ``s3://bucket/prefix``; S3 settings come
    from ``storage_options`` or the AWS_* environment variables (see :mod:`inorder.storage.fs`).
    With ``compact=True`` the driver merges small files after each commit by the level rule
    (``compaction_fanout`` files of a level into one of the next, up to level
    ``compaction_levels``, each merge reading at most ``compaction_max_merge_bytes``, by
    default the larger of 512 MiB and ``target_file_size``:
    :mod:`inorder.sinks.compaction_levels`), over the partitions the batches touched, in a
    thread beside the stream unless ``compact_in_background=False``
    (:mod:`inorder.sinks.parquet_compactor`). Every
    ``checkpoint_interval`` committed batches the driver consolidates the commit log into one
    checkpoint and deletes manifests older than ``manifest_retention`` batches before it (see
    :mod:`inorder.sinks.commit_checkpoint`); ``checkpoint_interval=0`` keeps every manifest.
    ``partition_by=["topic_bucket"]`` partitions by a column the sink derives from the topic,
    one of ``topic_buckets`` groups, rows sorted by topic in each row group
    (:mod:`inorder.sinks.topic_bucket`); a committed layout is never changed in place.
    """

    def __init__(
        self,
        path: str,
        partition_by: Sequence[str] = (),
        compression: str = "zstd",
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        storage_options: Mapping[str, str] | None = None,
        compact: bool = False,
        compaction_grace_seconds: float = 3600.0,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        manifest_retention: int = DEFAULT_MANIFEST_RETENTION,
        compaction_fanout: int = DEFAULT_FANOUT,
        compaction_levels: int = DEFAULT_LEVELS,
        compact_in_background: bool = True,
        compaction_max_merge_bytes: int | None = None,
        topic_buckets: int = tb.DEFAULT_TOPIC_BUCKETS,
    ) -> None:
        super().__init__(path, partition_by, compression, storage_options)
        self.topic_buckets = tb.check_buckets(topic_buckets)
        check_level_settings(compaction_fanout, compaction_levels)
        if target_file_size <= 0:
            raise SinkError("target_file_size must be > 0")
        if compaction_max_merge_bytes is None:  # a target above the default bound keeps working
            compaction_max_merge_bytes = max(DEFAULT_MAX_MERGE_BYTES, int(target_file_size))
        check_max_merge_bytes(compaction_max_merge_bytes, target_file_size)
        if checkpoint_interval < 0:
            raise SinkError(f"checkpoint_interval must be >= 0, not {checkpoint_interval}")
        if manifest_retention < 1:
            raise SinkError(f"manifest_retention must be >= 1, not {manifest_retention}")
        self.target_file_size = int(target_file_size)
        self.compact = compact
        self.compaction_grace_seconds = compaction_grace_seconds
        self.compaction_fanout = compaction_fanout
        self.compaction_levels = compaction_levels
        self.compact_in_background = compact_in_background
        self.compaction_max_merge_bytes = compaction_max_merge_bytes
        self._compactor: ParquetCompactor | None = None
        self.checkpoint_interval = int(checkpoint_interval)
        self.manifest_retention = int(manifest_retention)
        self._checkpointed: int | None = None
        """Batch id of the newest commit checkpoint, as of the last recovery or write."""
        self._recovered = False
        self._ends: dict[str, int] | None = None
        """Per partition, where the last committed batch's range ended (read once)."""

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_recovered"] = False
        state["_checkpointed"] = None
        state["_ends"] = None
        state["_compactor"] = None  # a driver thread and the lease: never shipped
        return state

    @property
    def compactor(self) -> ParquetCompactor:
        """What merges small files after each commit (``compact=True``)."""
        if self._compactor is None:
            self._compactor = ParquetCompactor(
                self.path, self.storage_options, self.target_file_size,
                self.compaction_grace_seconds, self.compression, self.compaction_fanout,
                self.compaction_levels, self.compact_in_background,
                max_merge_bytes=self.compaction_max_merge_bytes,
            )  # fmt: skip
        return self._compactor

    def guard_background(self, check: Callable[[], None]) -> None:
        """Run ``check`` (the lease's) before each merge's commit point."""
        self.compactor.guard = check

    def finish_background(self, timeout: float | None = None) -> str | None:
        """Let the compactor thread finish its pending round and stop."""
        return None if self._compactor is None else self._compactor.finish(timeout)

    def describe(self) -> str:
        """One line for humans."""
        parts = f", partitioned by {', '.join(self.partition_by)}" if self.partition_by else ""
        return f"Parquet dataset {self.path} ({self.compression}{parts})"

    # -- driver ------------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> None:
        """Fail with :class:`SinkError` unless the location is reachable and writable."""
        if tb.derives_bucket(self.partition_by, schema):
            schema = tb.bucketed_schema(schema, self.topic_buckets)
        for col in self.partition_by:
            if col not in schema.names:
                raise SinkError(f"{self.path}: partition_by column {col!r} is not in the output")
            if pa.types.is_nested(schema.field(col).type):
                raise SinkError(f"{self.path}: partition_by column {col!r} has a nested type")
        if len(self.partition_by) == len(schema.names):
            raise SinkError(f"{self.path}: every output column is a partition column")
        check_writable(self.location)
        self._schema = schema
        self._recover()
        self._check_owner()
        self._check_schema(schema)

    def _check_schema(self, schema: pa.Schema) -> None:
        """Refuse output rows the committed files' schema cannot take in place."""
        if self.last_committed_batch() is None:
            return
        state = load_state(self.location)
        tb.check_layout(self.path, state.partition_by, state.schema, self.partition_by, schema)
        committed = state.schema
        if committed is None or committed.equals(schema, check_metadata=False):
            return
        compatible, changes = schema_change(committed.remove_metadata(), schema.remove_metadata())
        if not compatible:
            raise SinkError(
                f"{self.path}: the output schema changed incompatibly ({'; '.join(changes)}); "
                "the dataset holds rows of the old schema and files of two schemas must not "
                "mix. Write this output to a new path with a new checkpoint (or a new "
                "job_version); only adding nullable columns evolves a dataset in place"
            )

    def _check_owner(self) -> None:
        """Refuse a dataset whose last commit came from another pipeline checkpoint."""
        if self.owner is None:
            return
        last = self.last_committed_batch()
        if last is None:
            return
        theirs = batch_owner(self.location, last)
        if theirs != self.owner:
            raise SinkError(
                f"{self.path}: already holds output committed by another pipeline checkpoint "
                f"(batch {last}, owner {theirs or 'unknown'}); batch ids restart with every "
                "checkpoint, so new batches would be taken for committed ones. Use a new output "
                "path, or the checkpoint that wrote it"
            )

    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        """Executor: a writer staging this task's rows of ``batch_id``."""
        bucketed = tb.derives_bucket(self.partition_by, schema)
        full = tb.bucketed_schema(schema, self.topic_buckets) if bucketed else schema
        writer = ParquetBatchWriter(
            self.location,
            full,
            self.partition_by,
            self.compression,
            self.target_file_size,
            prefix=f"{STAGING_DIR}/{batch_id}/{safe_key(task_key)}",
            suffix=STAGED_SUFFIX,
            flat=True,
            sort_by=tb.SORT_KEYS if bucketed else (),
        )
        return tb.BucketingWriter(writer, full) if bucketed else writer

    def is_committed(self, batch_id: int) -> bool:
        """Whether the manifest of ``batch_id`` exists (its publication is then certain),
        or a commit checkpoint records the batch (its manifest may have been deleted)."""
        loc = self.location
        if sfs.exists(loc, loc.join(COMMITS_DIR, manifest_name(batch_id))):
            return True
        # A manifest is deleted only after a checkpoint recording its batch exists.
        doc = newest_checkpoint(loc)
        return doc is not None and batch_id in BatchIds(doc["batches"])

    def last_committed_batch(self) -> int | None:
        """The highest committed batch id, ``None`` when nothing was committed."""
        listing = list_commits(self.location)
        ids = listing.manifests + listing.checkpoints
        return max(ids) if ids else None

    def read_batches(self, first: int, last: int, columns: Sequence[str] | None = None) -> pa.Table:
        """The committed rows of batches ``first..last`` (by their ``batch_id`` column).

        Files of other batches are not opened: a published file's name carries its batch id
        (``part-<batch_id>-<n>``); compacted files mix batches and are filtered by row.
        """
        return read_batch_range(self.location, first, last, columns)

    def commit(self, batch_id: int, files: Sequence[WrittenFile]) -> bool:
        """Publish the batch's staged files atomically; ``False`` if it was committed already.

        The manifest has no ``offsets``: only :meth:`commit_consumed` knows them.
        """
        return self._commit(batch_id, files, None)

    def commit_consumed(
        self, batch_id: int, files: Sequence[WrittenFile], consumed: Sequence[ConsumedOffsets]
    ) -> bool:
        """:meth:`commit`, recording in the manifest the ``[start, end)`` the batch consumed
        per partition (``offsets``; see :mod:`inorder.sinks.proof`)."""
        return self._commit(batch_id, files, consumed)

    def _commit(
        self,
        batch_id: int,
        files: Sequence[WrittenFile],
        consumed: Sequence[ConsumedOffsets] | None,
    ) -> bool:
        loc = self.location
        self._recover()
        prefix = f"{STAGING_DIR}/{batch_id}/"
        for f in files:
            if not f.path.startswith(prefix):
                raise SinkError(f"{self.path}: file {f.path} was not staged for batch {batch_id}")
        rel = f"{COMMITS_DIR}/{manifest_name(batch_id)}"
        if self._checkpointed is not None and batch_id <= self._checkpointed:
            # Its manifest may be gone: creating it again would publish the batch twice.
            if not self.is_committed(batch_id):
                raise SinkError(
                    f"{self.path}: batch {batch_id} is older than the commit checkpoint of "
                    f"batch {self._checkpointed} and was never committed"
                )
            for f in files:
                sfs.delete_quietly(loc, loc.join(f.path))
            self._clean_staging(batch_id)
            return False
        ordered = sorted(
            files, key=lambda f: (partition_dir(self.partition_by, f.partition_values), f.path)
        )
        entries = [
            {
                "staged": f.path,
                "final": final_name(
                    partition_dir(self.partition_by, f.partition_values), batch_id, n
                ),
                "rows": f.rows,
                "size_bytes": f.size_bytes,
                "partition_values": f.partition_values,
                **({"digest": f.digest} if f.digest is not None else {}),
            }
            for n, f in enumerate(ordered)
        ]
        manifest: dict[str, Any] = {
            "format": 1,
            "kind": "batch",
            "batch_id": batch_id,
            "created_at": time.time(),
            "partition_by": self.partition_by,
            "owner": self.owner,
            "files": entries,
        }
        if self._schema is not None:
            manifest["schema"] = encode_schema(self._schema)
        if consumed is not None:
            manifest["offsets"] = consumed_ranges(consumed, self._previous_ends())
        try:
            sfs.put_if_absent(loc, loc.join(rel), json.dumps(manifest).encode())
        except sfs.AlreadyExists:
            # Committed before (a re-run after a crash): finish it if needed, drop new files.
            if not sfs.exists(loc, loc.join(rel.removesuffix(".json") + ".done")):
                complete_manifest(loc, rel)
            for f in files:
                sfs.delete_quietly(loc, loc.join(f.path))
            self._clean_staging(batch_id)
            return False
        complete_manifest(loc, rel)
        self._clean_staging(batch_id)
        if consumed is not None and self._ends is not None:
            self._ends.update({k: v[1] for k, v in manifest["offsets"].items()})
        if self.compact:
            touched = {partition_dir(self.partition_by, f.partition_values) for f in files}
            self.compactor.after_commit(touched)
        self._maybe_checkpoint(batch_id)
        return True

    def _maybe_checkpoint(self, batch_id: int) -> None:
        """Consolidate the commit log once ``checkpoint_interval`` batches passed."""
        if not self.checkpoint_interval:
            return
        last = -1 if self._checkpointed is None else self._checkpointed
        if batch_id - last < self.checkpoint_interval:
            return
        from inorder.sinks.commit_checkpoint import write_checkpoint

        written = write_checkpoint(self.location, self.manifest_retention)
        if written is not None:
            self._checkpointed = written

    def _previous_ends(self) -> dict[str, int]:
        """Where the previous batches left each partition (its next range starts there)."""
        if self._ends is None:
            state = load_state(self.location)
            self._ends = {name: pieces[-1][1] for name, pieces in state.offsets.items() if pieces}
        return self._ends  # read only: a batch's driver work stays O(partitions with data)

    def _recover(self) -> None:
        """Finish manifests a crashed process left half-published (once per process)."""
        if self._recovered:
            return
        state = load_state(self.location)
        for rel in state.pending:
            complete_manifest(self.location, rel)
        self._checkpointed = state.checkpoint
        self._recovered = True

    def _clean_staging(self, batch_id: int) -> None:
        """Delete staged files of this and earlier batches: leftovers of failed attempts."""
        loc = self.location
        selector = pafs.FileSelector(loc.join(STAGING_DIR), allow_not_found=True)
        for info in loc.filesystem.get_file_info(selector):
            name = info.base_name
            if name.isdigit() and int(name) <= batch_id:
                sfs.delete_dir_quietly(loc, info.path)
                if info.type == pafs.FileType.File:
                    sfs.delete_quietly(loc, info.path)
        if loc.is_s3:
            # Staged objects of a batch directory may be listed without a directory entry.
            for info in sfs.list_files(loc, loc.join(STAGING_DIR, str(batch_id)), recursive=True):
                sfs.delete_quietly(loc, info.path)
