"""The change log and the session tables spilled to local files by session, so that checking
the tables (:mod:`inorder.sessions.tables_check`) holds one bucket of sessions at a time.

Every row goes to one of ``shards`` files per stream (the change log, each table), chosen
by a hash of its ``(topic, session)``: all rows of a session, in the log and in the tables,
land in the same shard. Streams are read in record batches (never whole), so spilling holds
one record batch. Shards are then taken in buckets of about ``bucket_rows`` rows
(:func:`bucket_shards`); a session is never split, so a bucket may exceed that bound by the
rows of its largest session.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

#: Shards of each stream when the bucket count is not forced: buckets of the default
#: ``bucket_rows`` up to some 25 million rows (change rows plus table rows); beyond that a
#: shard, and so a bucket, holds a 256th of the rows.
SHARDS = 256
#: Rows (change rows plus table rows) compared at once by default.
BUCKET_ROWS = 100_000
#: Column added to a table's rows: their position in the table's scan (messages about single
#: rows are ordered by it, as when the table was compared whole).
POSITION = "__position"
#: Rows per record batch read from a stream.
_READ_ROWS = 65_536


def shard_of(topics: pa.Array, sessions: pa.Array, shards: int) -> np.ndarray[Any, Any]:
    """The shard (``0..shards-1``) of each row's ``(topic, session)``; stable across runs."""
    joined = pc.binary_join_element_wise(
        pc.fill_null(topics.cast(pa.string()), ""),
        pc.fill_null(sessions.cast(pa.string()), ""),
        "\x1f",
    )
    encoded = pc.dictionary_encode(joined)
    # One hash per distinct session of the batch, not per row.
    names = encoded.dictionary.to_pylist()
    codes = np.fromiter(
        (zlib.crc32(n.encode()) % shards for n in names), dtype=np.int64, count=len(names)
    )
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    shard: np.ndarray[Any, Any] = codes[indices]
    return shard


class Spill:
    """Streams spilled under ``folder``, ``shards`` files each (Arrow IPC, LZ4)."""

    def __init__(self, folder: str | Path, shards: int) -> None:
        self.folder, self.shards = Path(folder), shards
        self._options = pa.ipc.IpcWriteOptions(compression="lz4")

    def write(
        self, name: str, batches: Iterable[pa.RecordBatch], position: bool = False
    ) -> list[int]:
        """Spill stream ``name``; its rows per shard. ``position``: add :data:`POSITION`."""
        counts = [0] * self.shards
        writers: dict[int, Any] = {}
        at = 0
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if position:
                    where = pa.array(np.arange(at, at + batch.num_rows, dtype=np.int64))
                    batch = batch.append_column(POSITION, where)
                at += batch.num_rows
                shard = shard_of(batch.column("topic"), batch.column("session"), self.shards)
                order = np.argsort(shard, kind="stable")  # keeps each shard's rows in order
                sizes = np.bincount(shard, minlength=self.shards)
                grouped = batch.take(pa.array(order))
                start = 0
                for s in np.flatnonzero(sizes):
                    n = int(sizes[s])
                    writer = writers.get(int(s))
                    if writer is None:
                        path = self.folder / f"{name}-{int(s)}.arrows"
                        writer = pa.ipc.new_stream(str(path), batch.schema, options=self._options)
                        writers[int(s)] = writer
                    writer.write_batch(grouped.slice(start, n))
                    counts[int(s)] += n
                    start += n
        finally:
            for writer in writers.values():
                writer.close()
            # The allocator keeps freed pages for reuse: given back, the next stream and the
            # buckets start from what is held, not from this stream's high point.
            pa.default_memory_pool().release_unused()
        return counts

    def read(self, name: str, shards: Iterable[int]) -> pa.Table | None:
        """The rows of stream ``name`` in ``shards`` (``None``: none spilled there)."""
        parts = []
        for s in shards:
            path = self.folder / f"{name}-{s}.arrows"
            if path.exists():
                with pa.ipc.open_stream(str(path)) as reader:
                    parts.append(reader.read_all())
        return pa.concat_tables(parts) if parts else None


def bucket_shards(sizes: list[int], bucket_rows: int) -> list[list[int]]:
    """Consecutive shards grouped into buckets of at most ``bucket_rows`` rows (a shard
    larger than that is a bucket of its own)."""
    buckets: list[list[int]] = [[]]
    held = 0
    for shard, n in enumerate(sizes):
        if buckets[-1] and held + n > bucket_rows:
            buckets.append([])
            held = 0
        buckets[-1].append(shard)
        held += n
    return buckets


def scan(dataset: ds.Dataset, condition: ds.Expression | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of ``dataset``, read ahead little (the default read-ahead holds dozens
    of batches) and in this thread (reading threads each keep freed memory of their own:
    at 1M records the peak was 100 MB higher)."""
    yield from dataset.to_batches(
        filter=condition,
        batch_size=_READ_ROWS,
        batch_readahead=1,
        fragment_readahead=1,
        use_threads=False,
    )


def change_log_batches(sink: Any, last: int) -> Iterator[pa.RecordBatch]:
    """The committed change rows of batches ``0..last`` of ``sink``, record batch after record
    batch (Parquet, Delta and Iceberg sinks are scanned; any other is read whole)."""
    from inorder.sinks.delta import DeltaSink
    from inorder.sinks.parquet import ParquetSink

    condition = (ds.field("batch_id") >= 0) & (ds.field("batch_id") <= last)
    if isinstance(sink, ParquetSink):
        from inorder.sinks.commit_log import load_state
        from inorder.sinks.parquet_read import committed_dataset

        state = load_state(sink.location)
        dataset = committed_dataset(sink.location, state)
        if dataset is None:
            return
        for batch in scan(dataset, condition):
            piece = pa.Table.from_batches([batch])
            if state.schema is not None:  # as read_batches gives them
                piece = piece.select(state.schema.names).cast(state.schema)
            yield from piece.to_batches()
        return
    if isinstance(sink, DeltaSink):
        from deltalake import DeltaTable

        from inorder.sinks.delta_read import delta_dataset

        loc = sink.location
        delta = DeltaTable(loc.delta_uri(), storage_options=loc.storage_options())
        yield from scan(delta_dataset(delta, loc), condition)
        return
    dataset_of = getattr(sink, "dataset", None)  # an Iceberg sink
    if callable(dataset_of):
        found = dataset_of()
        if found is not None:
            yield from scan(found, condition)
        return
    yield from sink.read_batches(0, last).to_batches(_READ_ROWS)
