"""The derived partition column ``topic_bucket``: many topics in few output partitions.

With ``partition_by = ["topic"]`` a batch writes at least one file per topic, however few
rows the topic sent; at hundreds of sites and a short trigger the files are tiny and many
(``docs/small-files.md``). ``partition_by = ["topic_bucket"]`` (with ``topic_buckets = N``,
default 32) groups the topics into ``N`` buckets instead, so a batch writes one file per
bucket per task.

The bucket of a topic is Iceberg's bucket transform of the topic name (the Iceberg table
spec, "Bucket Transform Details"): the 32-bit Murmur3 hash (x86 variant, seed 0) of the
name's UTF-8 bytes, ``(hash & 0x7FFFFFFF) % N``. It depends on nothing but the name and
``N``: the same in every process, release and language (not Python's ``hash()``, which is
salted per process), and the same value as an Iceberg ``bucket[N](topic)`` partition, so a
reader can compute which directory holds a topic with any Iceberg library (pyiceberg's
``BucketTransform``, Spark's ``system.bucket``).

The column is derived by the sink from the row's ``topic`` when the output has no column
of that name: an ``int32`` column ``topic_bucket``, added to the committed schema (readers
of the dataset see a real partition column) and to the directory names
(``topic_bucket=7/``). The rows of each row group are sorted by ``topic``, ``partition``,
``offset`` (stable: rows of one record keep their order), in batch files and in merged
ones, so the row groups' Parquet statistics of ``topic`` tell a reader which hold a topic.
The bucket count is kept in the field's metadata (``inorder.topic_buckets``), so it travels
with the committed schema (manifests and commit checkpoints); a sink refuses to write an
output whose layout it would change (:class:`OutputLayoutChanged`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from inorder.sinks.base import BatchWriter, SinkError, WrittenFile

#: The derived column's name, as given in ``partition_by``.
TOPIC_BUCKET = "topic_bucket"
#: Buckets when ``topic_buckets`` is not given.
DEFAULT_TOPIC_BUCKETS = 32
#: Field metadata key holding the bucket count in the committed schema.
BUCKETS_KEY = b"inorder.topic_buckets"
#: The order of rows inside each file of a bucketed output.
SORT_KEYS = ("topic", "partition", "offset")
#: Why a Delta or Iceberg sink refuses a derived ``topic_bucket``.
BUCKET_ONLY_PARQUET = (
    "partition_by 'topic_bucket': only the Parquet sink derives that column from the topic; "
    "a Delta or Iceberg output can be partitioned by it only as a column of the output rows"
)

_C1, _C2, _MASK = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF


class OutputLayoutChanged(SinkError):
    """The output holds committed files of another layout (``partition_by`` or bucket count).

    Files of two layouts must not mix: a reader parses every directory by one layout, and a
    topic would be found in two buckets. Write the new layout to a new output path.
    """


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(k: int) -> int:
    return (_rotl((k * _C1) & _MASK, 15) * _C2) & _MASK


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of ``data``, as an unsigned int (Iceberg's and ``mmh3``'s)."""
    h = seed & _MASK
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        h ^= _mix(int.from_bytes(data[i : i + 4], "little"))
        h = (_rotl(h, 13) * 5 + 0xE6546B64) & _MASK
    tail = data[whole:]
    if tail:
        h ^= _mix(int.from_bytes(tail, "little"))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def topic_bucket(topic: str, buckets: int) -> int:
    """The bucket of ``topic`` among ``buckets`` (Iceberg's ``bucket[buckets](topic)``)."""
    return (murmur3_32(topic.encode("utf-8")) & 0x7FFFFFFF) % buckets


def check_buckets(buckets: int) -> int:
    """``buckets`` if it is a valid bucket count, else :class:`SinkError`."""
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise SinkError(f"topic_buckets must be an integer >= 1, not {buckets!r}")
    return buckets


def derives_bucket(partition_by: Sequence[str], schema: pa.Schema) -> bool:
    """Whether the sink derives ``topic_bucket`` for rows of ``schema``."""
    return TOPIC_BUCKET in partition_by and TOPIC_BUCKET not in schema.names


def bucketed_schema(schema: pa.Schema, buckets: int) -> pa.Schema:
    """``schema`` with the derived ``topic_bucket`` column (the bucket count in its metadata)."""
    if "topic" not in schema.names or not pa.types.is_string(schema.field("topic").type):
        raise SinkError(f"partition_by {TOPIC_BUCKET!r} needs a string column 'topic'")
    meta = {BUCKETS_KEY: str(buckets).encode()}
    return schema.append(pa.field(TOPIC_BUCKET, pa.int32(), nullable=False, metadata=meta))


def committed_buckets(schema: pa.Schema | None) -> int | None:
    """The bucket count a committed schema records (``None``: not a derived bucket column)."""
    if schema is None or TOPIC_BUCKET not in schema.names:
        return None
    meta = schema.field(TOPIC_BUCKET).metadata or {}
    return int(meta[BUCKETS_KEY]) if BUCKETS_KEY in meta else None


def check_layout(
    where: str,
    committed_by: Sequence[str] | None,
    committed_schema: pa.Schema | None,
    partition_by: Sequence[str],
    schema: pa.Schema,
) -> None:
    """Refuse a layout other than the committed one (:class:`OutputLayoutChanged`).

    ``committed_by`` is ``None`` for an output without commits (any layout is new).
    """
    if committed_by is None:
        return
    if list(committed_by) != list(partition_by):
        raise OutputLayoutChanged(
            f"{where}: committed files are partitioned by {list(committed_by)}, the sink's "
            f"partition_by is {list(partition_by)}; files of two layouts must not mix. Write "
            "the new layout to a new output path (with a new checkpoint or job_version)"
        )
    theirs, ours = committed_buckets(committed_schema), committed_buckets(schema)
    if theirs != ours:
        raise OutputLayoutChanged(
            f"{where}: committed files are in {theirs} topic buckets, the sink's "
            f"topic_buckets is {ours}; changing it would move topics to other buckets. Keep "
            f"topic_buckets = {theirs}, or write to a new output path"
        )


def add_bucket(batch: pa.RecordBatch, schema: pa.Schema, cache: dict[str, int]) -> pa.RecordBatch:
    """``batch`` with its ``topic_bucket`` column (``schema``: :func:`bucketed_schema`).

    Hashed once per distinct topic of the batch (``cache`` keeps them across batches).
    """
    buckets = committed_buckets(schema)
    assert buckets is not None
    encoded = pc.dictionary_encode(batch.column("topic"))
    names = encoded.dictionary.to_pylist()
    for name in names:
        if name not in cache:
            cache[name] = topic_bucket(name, buckets)
    values = pa.array([cache[n] for n in names], pa.int32()).take(encoded.indices)
    return pa.RecordBatch.from_arrays([*batch.columns, values], schema=schema)


class BucketingWriter(BatchWriter):
    """Adds the derived ``topic_bucket`` column to every batch, then writes."""

    def __init__(self, inner: BatchWriter, schema: pa.Schema) -> None:
        self._inner = inner
        self._schema = schema
        self._cache: dict[str, int] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        """Write ``batch`` with its buckets."""
        self._inner.write(add_bucket(batch, self._schema, self._cache))

    def close(self) -> list[WrittenFile]:
        """Flush and return the staged files."""
        return self._inner.close()

    def abort(self) -> None:
        """Delete what was staged."""
        self._inner.abort()


__all__ = [
    "BUCKET_ONLY_PARQUET",
    "DEFAULT_TOPIC_BUCKETS",
    "SORT_KEYS",
    "TOPIC_BUCKET",
    "BucketingWriter",
    "OutputLayoutChanged",
    "add_bucket",
    "bucketed_schema",
    "check_buckets",
    "check_layout",
    "committed_buckets",
    "derives_bucket",
    "murmur3_32",
    "topic_bucket",
]
