"""Archive-aware record reads for the operations tools (``inorder replay``, ``validate``)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from inorder.archive.coverage import load_coverage
from inorder.archive.tiered_source import TieredOptions, plan_tiered, read_tiered_range
from inorder.kafka.options import SourceOptions
from inorder.records import TopicPartition


def read_tiered(
    options: SourceOptions, tp: TopicPartition, start: int, end: int
) -> Iterator[pa.RecordBatch]:
    """Records of ``tp`` in ``[start, end)``: from the archive below its end, then from Kafka."""
    assert isinstance(options, TieredOptions)
    coverage = load_coverage(options.archive, options.storage())
    archive_end, files = plan_tiered(coverage, tp, start, end)
    yield from read_tiered_range(
        options, tp, start, end, archive_end=archive_end, files=files, markers=False
    )
