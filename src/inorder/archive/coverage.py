"""What an archive holds, exactly: per topic-partition, committed offset ranges and their files.

Only batches whose sink manifest is done count (:func:`inorder.sinks.parquet.load_state`),
each with its offset index (:mod:`inorder.archive.layout`). Ranges of one topic-partition
are contiguous (the archiver reads with ``failOnDataLoss=true``), so the archive covers
``[start, end)`` per topic-partition and every Kafka record (``read_committed``) in it.

Reading a range (:func:`read_archived`) needs only the file list, so planning happens on the
driver and Spark tasks open the files they are given.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from inorder.archive.layout import ArchivedRange, read_index
from inorder.errors import InorderError
from inorder.kafka.consumer import SOURCE_ARROW_SCHEMA
from inorder.records import TopicPartition
from inorder.sinks.parquet import file_batch_id, load_state
from inorder.storage import fs as sfs


class ArchiveError(InorderError):
    """The archive cannot be used (missing index, gap, compacted files...)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One archive batch's range of one topic-partition and the files holding its records."""

    start: int
    end: int
    records: int
    files: tuple[str, ...]
    min_ts_us: int | None
    max_ts_us: int | None


@dataclass
class PartitionCoverage:
    """The archived ranges of one topic-partition, contiguous and by offset."""

    segments: list[Segment] = field(default_factory=list)

    @property
    def start(self) -> int:
        """First archived offset (inclusive)."""
        return self.segments[0].start

    @property
    def end(self) -> int:
        """End of the archive (exclusive): the next offset Kafka must provide."""
        return self.segments[-1].end

    def overlapping(self, start: int, end: int) -> list[Segment]:
        """Segments with offsets in ``[start, end)``."""
        ends = [s.end for s in self.segments]
        i = bisect.bisect_right(ends, start)
        out = []
        for seg in self.segments[i:]:
            if seg.start >= end:
                break
            if seg.end > start:
                out.append(seg)
        return out


@dataclass
class Coverage:
    """Everything committed in an archive, per topic-partition."""

    path: str
    partitions: dict[TopicPartition, PartitionCoverage]
    batches: int

    def of(self, tp: TopicPartition) -> PartitionCoverage | None:
        """The coverage of ``tp`` (``None``: nothing archived, or only empty ranges)."""
        cov = self.partitions.get(tp)
        return cov if cov is not None and cov.segments else None

    def files_for(self, tp: TopicPartition, start: int, end: int) -> list[str]:
        """Absolute paths of the files holding records of ``tp`` in ``[start, end)``."""
        cov = self.of(tp)
        if cov is None:
            return []
        return [f for seg in cov.overlapping(start, end) for f in seg.files]


def load_coverage(path: str, storage_options: Mapping[str, str] | None = None) -> Coverage:
    """Read the archive's committed batches and offset indexes into a :class:`Coverage`."""
    try:
        location = sfs.resolve(path, storage_options)
        state = load_state(location)
    except (OSError, InorderError) as exc:
        raise ArchiveError(f"archive {path}: cannot be read: {exc}") from None
    # Files by batch from their names (``part-<batch>-...``): the sink folds old manifests
    # into checkpoints, so a long archive has no per-batch manifest to read.
    by_batch: dict[int, dict[TopicPartition, list[str]]] = {}
    for rel, live in sorted(state.files.items()):
        bid = file_batch_id(rel)
        if bid is None:
            raise ArchiveError(
                f"archive {path}: file {rel} is not a batch file (compacted); tiered reads "
                "need the archive's batch files, do not compact it"
            )
        values = live.partition_values
        tp = TopicPartition(str(values.get("topic")), int(values.get("partition") or 0))
        by_batch.setdefault(bid, {}).setdefault(tp, []).append(location.join(rel))
    parts: dict[TopicPartition, PartitionCoverage] = {}
    for bid in state.batches:
        ranges = read_index(location, bid)
        if ranges is None:
            raise ArchiveError(
                f"archive {path}: batch {bid} has no offset index ({bid:020d}.json): "
                "not written by `inorder archive`"
            )
        by_tp = by_batch.get(bid, {})
        for r in ranges:
            _add(parts, path, r, tuple(by_tp.get(TopicPartition(r.topic, r.partition), ())))
    return Coverage(path, parts, len(state.batches))


def _add(
    parts: dict[TopicPartition, PartitionCoverage],
    path: str,
    r: ArchivedRange,
    files: tuple[str, ...],
) -> None:
    tp = TopicPartition(r.topic, r.partition)
    cov = parts.setdefault(tp, PartitionCoverage())
    if r.end <= r.start:
        return  # an empty range (a partition entering the plan) holds nothing
    if cov.segments and cov.segments[-1].end != r.start:
        raise ArchiveError(
            f"archive {path}: {tp} is not contiguous: a batch starts at offset {r.start} "
            f"but the archive ended at {cov.segments[-1].end}"
        )
    cov.segments.append(Segment(r.start, r.end, r.records, files, r.min_ts_us, r.max_ts_us))


def read_archived(
    files: Sequence[str],
    tp: TopicPartition,
    start: int,
    end: int,
    *,
    path: str,
    storage_options: Mapping[str, str] | None = None,
    batch_rows: int = 10_000,
) -> Iterator[pa.RecordBatch]:
    """Archived records of ``tp`` in ``[start, end)`` in offset order, as source batches.

    Batches have the Kafka source's schema (``SOURCE_ARROW_SCHEMA``), so they can stand in
    for records read from the broker. ``files`` come from :meth:`Coverage.files_for`.
    """
    if start >= end or not files:
        return
    location = sfs.resolve(path, storage_options)
    tables = []
    for f in files:
        table = pq.read_table(
            f,
            filesystem=location.filesystem,
            filters=[("offset", ">=", start), ("offset", "<", end)],
        )
        if table.num_rows:
            tables.append(table)
    if not tables:
        return
    data = pa.concat_tables(tables, promote_options="permissive")
    # Files of one batch split a range by date: offset order is restored here.
    data = data.take(pc.sort_indices(data.column("offset")))
    n = data.num_rows
    source = pa.Table.from_arrays(
        [
            data.column("key"),
            data.column("value"),
            pa.array([tp.topic] * n, pa.string()),
            pa.array([tp.partition] * n, pa.int32()),
            data.column("offset"),
            data.column("timestamp").cast(SOURCE_ARROW_SCHEMA.field("timestamp").type),
            data.column("timestamp_type"),
            data.column("headers").cast(SOURCE_ARROW_SCHEMA.field("headers").type),
        ],
        schema=SOURCE_ARROW_SCHEMA,
    )
    yield from source.to_batches(max_chunksize=batch_rows)


def first_offset_at(
    coverage: Coverage,
    tp: TopicPartition,
    ts_ms: int,
    storage_options: Mapping[str, str] | None = None,
) -> int | None:
    """The first archived offset of ``tp`` whose timestamp is at or after ``ts_ms``."""
    cov = coverage.of(tp)
    if cov is None:
        return None
    ts_us = ts_ms * 1000
    for seg in cov.segments:
        if seg.max_ts_us is None or seg.max_ts_us < ts_us or not seg.files:
            continue
        for batch in read_archived(
            seg.files, tp, seg.start, seg.end, path=coverage.path, storage_options=storage_options
        ):
            stamps = batch.column("timestamp").cast(pa.int64())
            hit = pc.fill_null(pc.greater_equal(stamps, ts_us), False)
            if pc.any(hit).as_py():
                offsets = pc.filter(batch.column("offset"), hit)
                return int(pc.min(offsets).as_py())
    return None
