"""The derived ``topic_bucket`` column: a stable hash, its column, the layout check, sorting.

The expected buckets are fixed numbers: a change of the hash would move committed topics to
other directories, so it must fail here, not in an output.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from inorder.records import BATCH_ID_FIELD, ORIGIN_FIELDS
from inorder.sinks.base import SinkError
from inorder.sinks.parquet_writer import ParquetBatchWriter
from inorder.sinks.topic_bucket import (
    SORT_KEYS,
    TOPIC_BUCKET,
    BucketingWriter,
    OutputLayoutChanged,
    bucketed_schema,
    check_buckets,
    check_layout,
    committed_buckets,
    derives_bucket,
    murmur3_32,
    topic_bucket,
)
from inorder.storage import fs as sfs

SCHEMA = pa.schema([*ORIGIN_FIELDS, pa.field("v", pa.string()), BATCH_ID_FIELD])


def test_the_hash_is_murmur3_x86_32_as_iceberg_specifies() -> None:
    # The Iceberg table spec's test vector for strings: hash("iceberg") = 1210000089.
    assert murmur3_32(b"iceberg") == 1210000089
    # Every tail length (0 to 3 bytes after the 4-byte blocks) and a non-ASCII name (values
    # of the mmh3 package, an independent implementation).
    assert [murmur3_32(s.encode()) for s in ("", "a", "ab", "abc", "abcd", "site-0001")] == [
        0,
        1009084850,
        2613040991,
        3017643002,
        1139631978,
        3856072725,
    ]
    assert murmur3_32("é漢字".encode()) == 4020686648


def test_buckets_are_fixed_numbers() -> None:
    expected = {"site-0000": 16, "site-0001": 21, "site-0999": 28, "orders": 9, "iceberg": 25}
    assert {t: topic_bucket(t, 32) for t in expected} == expected
    assert [topic_bucket("site-0001", n) for n in (1, 2, 16, 32, 1000)] == [0, 1, 5, 21, 77]


def test_the_bucket_equals_icebergs_bucket_transform() -> None:
    transforms = pytest.importorskip("pyiceberg.transforms")
    types = pytest.importorskip("pyiceberg.types")
    for n in (4, 16, 32):
        apply = transforms.BucketTransform(n).transform(types.StringType())
        for i in range(200):
            name = f"site-{i:04d}"
            assert topic_bucket(name, n) == apply(name)


def test_bucket_count_and_the_derived_column() -> None:
    assert check_buckets(32) == 32
    for bad in (0, -1, True, 2.0):
        with pytest.raises(SinkError, match="topic_buckets must be an integer"):
            check_buckets(bad)  # type: ignore[arg-type]
    assert derives_bucket([TOPIC_BUCKET], SCHEMA)
    assert not derives_bucket(["topic"], SCHEMA)
    full = bucketed_schema(SCHEMA, 8)
    assert full.field(TOPIC_BUCKET).type == pa.int32()
    assert not full.field(TOPIC_BUCKET).nullable
    assert committed_buckets(full) == 8 and committed_buckets(SCHEMA) is None
    # An output that has a column of that name keeps it: nothing is derived.
    assert not derives_bucket([TOPIC_BUCKET], full)
    with pytest.raises(SinkError, match="string column 'topic'"):
        bucketed_schema(pa.schema([pa.field("x", pa.int64())]), 8)


def test_a_layout_change_is_refused_by_name() -> None:
    full = bucketed_schema(SCHEMA, 8)
    check_layout("out", None, None, [TOPIC_BUCKET], full)  # nothing committed: any layout
    check_layout("out", [TOPIC_BUCKET], full, [TOPIC_BUCKET], bucketed_schema(SCHEMA, 8))
    with pytest.raises(OutputLayoutChanged, match=r"in 8 topic buckets, .* is 16"):
        check_layout("out", [TOPIC_BUCKET], full, [TOPIC_BUCKET], bucketed_schema(SCHEMA, 16))
    with pytest.raises(OutputLayoutChanged, match=r"partitioned by \['topic'\]"):
        check_layout("out", ["topic"], SCHEMA, [TOPIC_BUCKET], full)
    with pytest.raises(OutputLayoutChanged, match=r"partition_by is \['topic'\]"):
        check_layout("out", [TOPIC_BUCKET], full, ["topic"], SCHEMA)


def test_a_task_writes_one_file_per_bucket_sorted_by_topic(tmp_path: Path) -> None:
    topics = [f"site-{i:03d}" for i in range(40)]
    full = bucketed_schema(SCHEMA, 4)
    loc = sfs.resolve(str(tmp_path))
    inner = ParquetBatchWriter(
        loc, full, [TOPIC_BUCKET], "zstd", 1 << 27, prefix="s", flat=True, sort_by=SORT_KEYS
    )
    writer = BucketingWriter(inner, full)
    # Topic-partitions arrive in any order, two rows per record (kept in their order).
    for offset in range(3):
        for topic in reversed(topics):
            n = 2
            writer.write(
                pa.RecordBatch.from_pydict(
                    {
                        "topic": [topic] * n,
                        "partition": [0] * n,
                        "offset": [offset] * n,
                        "v": [f"{topic}/{offset}/{k}" for k in range(n)],
                        "batch_id": [0] * n,
                    },
                    schema=SCHEMA,
                )
            )
    files = writer.close()
    assert sorted(f.partition_values[TOPIC_BUCKET] for f in files) == ["0", "1", "2", "3"]
    assert sum(f.rows for f in files) == 40 * 3 * 2
    for f in files:
        table = pq.read_table(loc.join(f.path))
        assert TOPIC_BUCKET not in table.column_names  # in the directory name, hive style
        rows = list(zip(*(table.column(c).to_pylist() for c in (*SORT_KEYS, "v")), strict=True))
        assert rows == sorted(rows)  # by topic, partition, offset; then emit order (k)
        bucket = int(f.partition_values[TOPIC_BUCKET] or "")
        assert {topic_bucket(r[0], 4) for r in rows} == {bucket}
