"""The raw archive's dataset layout: columns, partitioning and the per-batch offset index.

An archive is a Parquet dataset written through :class:`~inorder.sinks.parquet.ParquetSink`
(its commit log decides what is committed) plus one small offset index per micro-batch::

    <root>/topic=<t>/date=<yyyy-mm-dd>/partition=<p>/part-<batch>-<n>.parquet
    <root>/_inorder/commits/<batch:020d>.json|.done          the sink's manifests
    <root>/_archive/ranges/<batch:020d>.json                 offset ranges of the batch

The index names, per topic-partition, the exact range ``[start, end)`` of Kafka offsets the
batch covered, including offsets that are not records (transaction markers, compaction
gaps): record offsets alone cannot tell where the archive ends. It is written before the
batch's sink commit and its content depends only on the batch's offsets (a re-run writes the
same document), so it is valid exactly when the batch's manifest is done.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from inorder.storage import fs as sfs

#: Directory of the offset index, next to the sink's ``_inorder`` log.
INDEX_DIR = "_archive/ranges"

#: Hive partition columns, outermost first. ``partition`` is a directory level too: each
#: archive task writes exactly one topic-partition, so files map to one topic-partition.
PARTITION_BY = ("topic", "date", "partition")

_HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))

#: Columns of the archive dataset (partition columns included, as readers see them).
ARCHIVE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", _HEADER_TYPE),
        pa.field("date", pa.date32()),
    ]
)

#: Columns stored inside each file (the partition columns live in directory names).
FILE_COLUMNS = tuple(n for n in ARCHIVE_SCHEMA.names if n not in PARTITION_BY)


@dataclass(frozen=True, slots=True)
class ArchivedRange:
    """Offsets ``[start, end)`` of one topic-partition covered by one archive batch."""

    topic: str
    partition: int
    start: int
    end: int
    records: int
    min_ts_us: int | None = None
    max_ts_us: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (stable key order)."""
        return {
            "end": self.end,
            "max_ts_us": self.max_ts_us,
            "min_ts_us": self.min_ts_us,
            "partition": self.partition,
            "records": self.records,
            "start": self.start,
            "topic": self.topic,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArchivedRange:
        """Inverse of :meth:`to_json`."""
        return cls(
            topic=str(data["topic"]),
            partition=int(data["partition"]),
            start=int(data["start"]),
            end=int(data["end"]),
            records=int(data["records"]),
            min_ts_us=None if data.get("min_ts_us") is None else int(data["min_ts_us"]),
            max_ts_us=None if data.get("max_ts_us") is None else int(data["max_ts_us"]),
        )


def index_name(batch_id: int) -> str:
    """File name of a batch's offset index."""
    return f"{batch_id:020d}.json"


def write_index(location: sfs.Location, batch_id: int, ranges: Sequence[ArchivedRange]) -> None:
    """Write the offset index of ``batch_id`` (whole-file, atomic; same content on re-runs)."""
    ordered = sorted(ranges, key=lambda r: (r.topic, r.partition))
    doc = {"format": 1, "batch_id": batch_id, "ranges": [r.to_json() for r in ordered]}
    data = json.dumps(doc, sort_keys=True).encode()
    sfs.write_bytes(location, location.join(INDEX_DIR, index_name(batch_id)), data)


_INDEX_CACHE: dict[tuple[str, int], list[ArchivedRange]] = {}


def read_index(location: sfs.Location, batch_id: int) -> list[ArchivedRange] | None:
    """The offset index of a committed batch (cached: immutable once the batch is done)."""
    key = (location.uri, batch_id)
    cached = _INDEX_CACHE.get(key)
    if cached is not None:
        return cached
    path = location.join(INDEX_DIR, index_name(batch_id))
    data = sfs.read_bytes_if_exists(location, path)
    if data is None:
        return None
    ranges = [ArchivedRange.from_json(r) for r in json.loads(data)["ranges"]]
    if len(_INDEX_CACHE) > 200_000:
        _INDEX_CACHE.clear()
    _INDEX_CACHE[key] = ranges
    return ranges
